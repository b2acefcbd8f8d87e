"""Dedup options of a task and of a call, validated into :class:`UniqueOptions`.

Set on the task (``@app.task(base=DedupeTask, unique=True, unique_ttl=600)``), overridden
per call (``task.apply_async_unique(args, unique_ttl=60)``), else the app's defaults.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from dedupe.errors import ConfigurationError

from . import defaults
from .config import DedupeConfig, positive_seconds
from .generics import AnyTask

__all__ = [
    "CALL_OPTIONS",
    "SEPARATE_RUN_LOCK",
    "UniqueOptions",
    "Until",
    "options_for",
    "pop_call_options",
    "resolve",
    "until_of",
]

#: Options a call may pass, next to Celery's own.
CALL_OPTIONS = ("unique_on", "unique_key", "unique_ttl", "unique_until", "on_duplicate")

#: How long a call's key lives: until its run finished, until it started, or for its whole
#: ``unique_ttl`` from acceptance whether or not it ran (a throttle window).
Until = Literal["finished", "started", "window"]
#: The modes whose run holds a key of its own (``<call key>:run``) beside the call's record.
SEPARATE_RUN_LOCK = frozenset({"started", "window"})

_CHOICES: dict[str, tuple[str, ...]] = {
    "unique_until": get_args(Until),
    "on_duplicate": ("return", "raise"),
    "on_running": ("skip", "retry"),
}


@dataclass(frozen=True, slots=True)
class UniqueOptions:
    """How one call (or one run) of a task is deduplicated."""

    on: tuple[str, ...] | None = None
    key: Callable[..., Any] | None = None
    ttl: float = defaults.TTL
    until: Until = "finished"
    lease: float = defaults.LEASE
    on_duplicate: Literal["return", "raise"] = "return"
    on_running: Literal["skip", "retry"] = "skip"
    running_countdown: float = defaults.RUNNING_COUNTDOWN


def until_of(value: Any) -> Until:
    """A ``unique_until`` value as the modes name it ("finished" for anything unknown, as a
    message from a newer producer may carry)."""
    if value == "started" or value == "window":
        return cast("Until", value)
    return "finished"


def pop_call_options(options: MutableMapping[str, Any]) -> dict[str, Any] | None:
    """Take the dedup options out of a call's Celery options (None: there were none)."""
    if options.keys().isdisjoint(CALL_OPTIONS):
        return None  # most calls: no dict to build
    return {name: options.pop(name) for name in CALL_OPTIONS if name in options}


def resolve(
    task: AnyTask | None,
    task_name: str,
    config: DedupeConfig,
    overrides: Mapping[str, Any] | None = None,
) -> UniqueOptions:
    """Merge call overrides, task attributes and app defaults, and validate them.

    ``task`` may be any Celery task (the attributes are read if present) or None for a task
    that is not registered in this process.
    """

    def pick(name: str, default: Any = None) -> Any:
        if overrides and overrides.get(name) is not None:
            return overrides[name]
        # Static lookup: a function set as a task attribute (unique_key=...) must not come
        # back bound to the task instance.
        value = inspect.getattr_static(task, name, None) if task is not None else None
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__get__(task)
        return default if value is None else value

    def choice(name: str, default: str) -> Any:
        value = pick(name, default)
        if value not in _CHOICES[name]:
            allowed = " or ".join(repr(c) for c in _CHOICES[name])
            raise ConfigurationError(f"task {task_name!r}: {name} must be {allowed}; got {value!r}")
        return value

    def seconds(name: str, default: float) -> float:
        try:
            return positive_seconds(name, pick(name, default))
        except ConfigurationError as exc:
            raise ConfigurationError(f"task {task_name!r}: {exc}") from None

    until = choice("unique_until", "finished")
    return UniqueOptions(
        on=_names(task_name, pick("unique_on")),
        key=_callable(task_name, pick("unique_key")),
        ttl=seconds("unique_ttl", config.default_ttl),
        until=until_of(until),
        lease=seconds("unique_lease", config.default_lease),
        on_duplicate=cast('Literal["return", "raise"]', choice("on_duplicate", "return")),
        # until="started" promises that a call made during a run runs after it: a queued
        # copy that meets the run lock always waits, whatever on_running says. An exclusive
        # task's calls are all published (nothing deduplicates them): each waits its turn.
        on_running=cast(
            'Literal["skip", "retry"]',
            choice("on_running", "retry" if _exclusive_only(task) else "skip"),
        ),
        running_countdown=seconds("on_running_countdown", defaults.RUNNING_COUNTDOWN),
    )


# Task-level options change only when the code does: resolved once per task and kept on the
# task object (as the key binder is), checked against the app's settings they were made with.
_CACHE_ATTRIBUTE = "_dedupe_options"


def options_for(
    task: AnyTask | None,
    task_name: str,
    config: DedupeConfig,
    overrides: Mapping[str, Any] | None = None,
) -> UniqueOptions:
    """The dedup options of a call of ``task`` (None: a task not registered here)."""
    if overrides or task is None:
        return resolve(task, task_name, config, overrides)
    cached = getattr(task, _CACHE_ATTRIBUTE, None)
    if type(cached) is tuple and cached[0] is config:
        options: UniqueOptions = cached[1]
        return options
    options = resolve(task, task_name, config)
    setattr(task, _CACHE_ATTRIBUTE, (config, options))
    return options


def _exclusive_only(task: AnyTask | None) -> bool:
    return bool(getattr(task, "exclusive", False)) and not getattr(task, "unique", False)


def _names(task_name: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Sequence) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigurationError(
        f"task {task_name!r}: unique_on must be a non-empty sequence of argument names, "
        f"such as unique_on=('customer_id',); got {value!r}"
    )


def _callable(task_name: str, value: Any) -> Callable[..., Any] | None:
    if value is None or callable(value):
        return cast("Callable[..., Any] | None", value)
    raise ConfigurationError(
        f"task {task_name!r}: unique_key must be a callable that takes the task's arguments "
        f"and returns the value to deduplicate on; got {value!r}"
    )
