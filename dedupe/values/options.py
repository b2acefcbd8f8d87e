"""Dedup options of a task and of a call, validated into :class:`UniqueOptions`.

Set on the task (``@app.task(base=DedupeTask, unique=True, unique_ttl=600)``), overridden
per call (``task.apply_async_unique(args, unique_ttl=60)``), else the app's defaults.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Collection, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from celery import Task as CeleryTask

from dedupe.errors import ConfigurationError
from dedupe.surfaces import AnyTask

from . import defaults
from .catalog import OPTIONS
from .config import DedupeConfig, positive_seconds
from .limits import LimitHeader, Rate, check_concurrency, concurrency_of, parse_rate

__all__ = [
    "CALL_OPTIONS",
    "GUARDS_RUNS",
    "LIMIT_OPTIONS",
    "SEPARATE_RUN_LOCK",
    "TASK_OPTIONS",
    "UniqueOptions",
    "Until",
    "check_call_names",
    "check_declared",
    "check_names",
    "check_plain_task",
    "dedupes_every_call",
    "limit_header",
    "options_for",
    "pop_call_options",
    "resolve",
    "until_of",
]

#: A task class attribute, True on DedupeTask: its runs call the execution guard (its
#: ``before_start``; other bases are claimed and released, but never kept apart), and every
#: option is read off its class. Off another base, a method named like an option is that
#: base's own (celery-singleton's ``on_duplicate``).
GUARDS_RUNS = "_dedupe_guards_runs"

#: Options a call may pass, next to Celery's own.
CALL_OPTIONS = tuple(option.name for option in OPTIONS if option.where == "task or call")
#: Flow control per key (task options): every call is accepted and runs, in turn.
LIMIT_OPTIONS = tuple(option.name for option in OPTIONS if option.flow_control)
#: Options a task may declare (``@app.task(base=DedupeTask, ...)``).
TASK_OPTIONS = tuple(option.name for option in OPTIONS)
#: Names of the family this version does not have: whoever gives one expects what it does
#: not get.
_NOT_HERE: tuple[str, ...] = ()
_FAMILY_PREFIXES = (
    "unique",
    "on_duplicate",
    "on_running",
    "debounce",
    "key_concurrency",
    "key_rate",
)
#: The names of Celery's Task. (Listed, never looked up: a class property such as Task.app
#: binds Celery's own base class to the current app when read.)
_CELERYS = frozenset(dir(CeleryTask))

#: How long a call's key lives: until its run finished, until it started, or for its whole
#: ``unique_ttl`` from acceptance whether or not it ran (a throttle window).
Until = Literal["finished", "started", "window"]
#: The modes whose run holds a key of its own (``<call key>:run``) beside the call's record.
SEPARATE_RUN_LOCK = frozenset({"started", "window"})

_CHOICES: dict[str, tuple[str, ...]] = {
    "unique_until": get_args(Until),
    "on_duplicate": ("return", "raise", "replace"),
    "on_running": ("skip", "retry"),
}


@dataclass(frozen=True, slots=True)
class UniqueOptions:
    """How one call (or one run) of a task is deduplicated."""

    on: tuple[str, ...] | None = None
    key: Callable[..., object] | None = None
    ttl: float = defaults.TTL
    until: Until = "finished"
    lease: float = defaults.LEASE
    on_duplicate: Literal["return", "raise", "replace"] = "return"
    on_running: Literal["skip", "retry"] = "skip"
    running_countdown: float = defaults.RUNNING_COUNTDOWN
    #: Seconds of quiet after a call before the burst's one run (None: no debounce).
    debounce: float | None = None
    #: Seconds after a burst's first call by which its run starts however busy the key is.
    debounce_max_wait: float | None = None
    #: ``key_concurrency``: runs of one key at once (or a callable of the call's arguments
    #: returning that number); None: no limit.
    concurrency: int | Callable[..., object] | None = None
    #: ``key_rate_limit``: starts of one key per period; None: no limit.
    rate: Rate | None = None

    @property
    def limited(self) -> bool:
        """Flow control per key: every call is accepted, and its run waits its turn."""
        return self.concurrency is not None or self.rate is not None

    @property
    def latest(self) -> Literal["debounce", "replace"] | None:
        """The mode whose run takes the latest call's arguments (None: the first call's)."""
        if self.debounce is not None:
            return "debounce"
        return "replace" if self.on_duplicate == "replace" else None


def until_of(value: object) -> Until:
    """A ``unique_until`` value as the modes name it ("finished" for anything unknown, as a
    message from a newer producer may carry)."""
    if value == "started" or value == "window":
        return value
    return "finished"


def pop_call_options(options: MutableMapping[str, Any]) -> dict[str, object] | None:
    """Take the dedup options out of a call's Celery options (None: there were none)."""
    if options.keys().isdisjoint(CALL_OPTIONS):
        return None  # most calls: no dict to build
    return {name: options.pop(name) for name in CALL_OPTIONS if name in options}


def resolve(
    task: AnyTask | None,
    task_name: str,
    config: DedupeConfig,
    overrides: Mapping[str, object] | None = None,
) -> UniqueOptions:
    """Merge call overrides, task attributes and app defaults, and validate them.

    ``task`` may be any Celery task (the attributes are read if present) or None for a task
    that is not registered in this process.
    """

    ours = getattr(task, GUARDS_RUNS, False)

    def pick(name: str, default: object = None) -> object:
        if overrides and overrides.get(name) is not None:
            return overrides[name]
        # Static lookup: a function set as a task attribute (unique_key=...) must not come
        # back bound to the task instance.
        value = inspect.getattr_static(task, name, None) if task is not None else None
        if name != "unique_key" and not ours and _a_method_of_its_class(value, name):
            value = None
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__get__(task)
        return default if value is None else value

    def choice(name: str, default: str) -> str:
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

    debounce = _optional_seconds(task_name, "debounce", pick("debounce"))
    max_wait = _optional_seconds(task_name, "debounce_max_wait", pick("debounce_max_wait"))
    # A debounced burst ends as its run starts: a call during the run opens the next one.
    until = choice("unique_until", "started" if debounce is not None else "finished")
    on_duplicate = choice("on_duplicate", "return")
    _check_latest(task_name, debounce, max_wait, until, on_duplicate)
    concurrency, rate = _limits(task, task_name, pick)
    return UniqueOptions(
        on=_names(task_name, pick("unique_on")),
        key=_callable(task_name, pick("unique_key")),
        ttl=seconds("unique_ttl", config.default_ttl),
        until=until_of(until),
        lease=seconds("unique_lease", config.default_lease),
        on_duplicate=cast('Literal["return", "raise", "replace"]', on_duplicate),
        # until="started" promises that a call made during a run runs after it: a queued
        # copy that meets the run lock always waits, whatever on_running says. An exclusive
        # task's calls are all published (nothing deduplicates them): each waits its turn.
        on_running=cast(
            'Literal["skip", "retry"]',
            choice("on_running", "retry" if _exclusive_only(task) else "skip"),
        ),
        running_countdown=seconds("on_running_countdown", defaults.RUNNING_COUNTDOWN),
        debounce=debounce,
        debounce_max_wait=max_wait,
        concurrency=concurrency,
        rate=rate,
    )


def _limits(
    task: AnyTask | None, task_name: str, pick: Callable[[str], object]
) -> tuple[int | Callable[..., object] | None, Rate | None]:
    """``key_concurrency`` and ``key_rate_limit``, checked, and refused beside the options
    that deduplicate (a limited task accepts every call: nothing is a duplicate)."""
    given_concurrency, given_rate = pick("key_concurrency"), pick("key_rate_limit")
    if given_concurrency is None and given_rate is None:
        return None, None
    concurrency = (
        None if given_concurrency is None else check_concurrency(given_concurrency, task_name)
    )
    rate = None if given_rate is None else parse_rate(given_rate, task_name)
    where = f"task {task_name!r}"
    if rate is None:
        option = "key_concurrency"
    elif concurrency is None:
        option = "key_rate_limit"
    else:
        option = "key_concurrency with key_rate_limit"
    if getattr(task, "unique", False) is True or getattr(task, "exclusive", False) is True:
        flag = "unique" if getattr(task, "unique", False) is True else "exclusive"
        raise ConfigurationError(
            f"{where}: {option} accepts every call and runs each in turn; {flag}=True would "
            f"{'drop duplicates' if flag == 'unique' else 'allow one run at a time'} instead: "
            f"drop {flag}=True (the limit's key comes from unique_on or unique_key)"
        )
    for name in ("unique_until", "on_duplicate", "debounce", "debounce_max_wait"):
        if pick(name) is not None:
            raise ConfigurationError(
                f"{where}: {name} has no meaning with {option}: a limited task deduplicates "
                f"nothing (every call is accepted and runs in turn); drop {name}, or drop "
                f"{option} and use unique=True"
            )
    return concurrency, rate


def _optional_seconds(task_name: str, name: str, value: object) -> float | None:
    if value is None:
        return None
    try:
        return positive_seconds(name, value)
    except ConfigurationError as exc:
        raise ConfigurationError(f"task {task_name!r}: {exc}") from None


def _check_latest(
    task_name: str, debounce: float | None, max_wait: float | None, until: str, on_duplicate: str
) -> None:
    """Refuse the combinations of debounce and replace that have no meaning."""
    where = f"task {task_name!r}"
    if max_wait is not None and debounce is None:
        raise ConfigurationError(
            f"{where}: debounce_max_wait caps a debounce and needs one: set debounce=<seconds> too"
        )
    if debounce is not None and max_wait is not None and max_wait < debounce:
        raise ConfigurationError(
            f"{where}: debounce_max_wait ({max_wait:g}) is shorter than debounce "
            f"({debounce:g}): a run would never wait the quiet period; set "
            f"debounce_max_wait >= debounce, or leave it out"
        )
    if debounce is not None and until != "started":
        # "finished" would answer a call made during the run with the run's id, its
        # arguments never run; a throttle window ("window") holds the key after the run.
        raise ConfigurationError(
            f"{where}: debounce ends a burst when its run starts, which is "
            f'unique_until="started" (its default); unique_until={until!r} would drop '
            f"the arguments of calls made during the run: leave unique_until out"
        )
    if debounce is not None and on_duplicate == "raise":
        raise ConfigurationError(
            f"{where}: debounce answers every call of a burst with the burst's task id; "
            f'on_duplicate="raise" would refuse them: leave on_duplicate out'
        )
    if on_duplicate == "replace" and until == "window":
        raise ConfigurationError(
            f'{where}: on_duplicate="replace" with unique_until="window" has no meaning: a '
            f"throttle window drops the calls it holds off, it has no queued call to replace; "
            f'use unique_until="finished" or "started"'
        )


# Task-level options change only when the code does: resolved once per task and kept on the
# task object (as the key binder is), checked against the app's settings they were made with.
_CACHE_ATTRIBUTE = "_dedupe_options"


def options_for(
    task: AnyTask | None,
    task_name: str,
    config: DedupeConfig,
    overrides: Mapping[str, object] | None = None,
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


def _a_method_of_its_class(value: object, name: str) -> bool:
    """Is ``value`` a method of the task's class or a base, by that name? Off a DedupeTask,
    another library's API, not our option (celery-singleton's Singleton.on_duplicate). An
    option given as a function is a plain one, set on the task's class by ``@app.task``.

    >>> class Base:
    ...     def on_duplicate(self, task_id): ...
    >>> _a_method_of_its_class(Base.__dict__["on_duplicate"], "on_duplicate")
    True
    >>> _a_method_of_its_class(print, "on_duplicate")
    False
    """
    function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    return inspect.isfunction(function) and function.__qualname__.endswith(f".{name}")


def _exclusive_only(task: AnyTask | None) -> bool:
    return bool(getattr(task, "exclusive", False)) and not getattr(task, "unique", False)


def _names(task_name: str, value: object) -> tuple[str, ...] | None:
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


def _callable(task_name: str, value: object) -> Callable[..., object] | None:
    if value is None or callable(value):
        return cast("Callable[..., object] | None", value)
    raise ConfigurationError(
        f"task {task_name!r}: unique_key must be a callable that takes the task's arguments "
        f"and returns the value to deduplicate on; got {value!r}"
    )


def check_names(where: str, names: Iterable[str], known: Collection[str]) -> None:
    """Refuse a name of this library's family that is not in ``known``: misspelt, given
    where it does nothing, or not in this version (the nearest valid name suggested).
    ``where`` starts the message (``"task 'proj.report'"``)."""
    for name in names:
        if name in known or not _of_the_family(name):
            continue
        if name in TASK_OPTIONS:
            raise ConfigurationError(f"{where}: {name} does nothing here; {_where_it_works(name)}")
        if name in _NOT_HERE:
            raise ConfigurationError(
                f"{where}: {name} is not an option of this celery-dedupe version; "
                f"its options are {', '.join(TASK_OPTIONS)}"
            )
        valid = known or TASK_OPTIONS
        nearest = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        hint = f"did you mean {nearest[0]}?" if nearest else f"its options: {', '.join(valid)}"
        if not known:
            hint += " (an option of a task declared with base=dedupe.DedupeTask)"
        raise ConfigurationError(f"{where}: {name} is not an option of celery-dedupe; {hint}")


def check_call_names(task_name: str, options: Iterable[str], known: Collection[str]) -> None:
    """:func:`check_names` for a call's options, on the hot path: each name met is judged
    once per process (a call's options are Celery's, almost always)."""
    for name in options:
        if name not in _PLAIN and name not in known:
            if _of_the_family(name):
                check_names(f"task {task_name!r}", (name,), known)
            if len(_PLAIN) < 4096:  # (names come from code: a bound never met in practice)
                _PLAIN.add(name)


#: Names met that are not of the family (Celery's options, a user's message properties).
_PLAIN: set[str] = set()


def _of_the_family(name: str) -> bool:
    if name in _CELERYS:
        return False  # (Celery's own: rate_limit is near key_rate_limit)
    if name.startswith(_FAMILY_PREFIXES) or name in _NOT_HERE:
        return True
    family = (*TASK_OPTIONS, *_NOT_HERE)
    return bool(difflib.get_close_matches(name, family, n=1, cutoff=0.8))


def _where_it_works(name: str) -> str:
    if name == "unique":
        return (
            "declare the task with base=dedupe.DedupeTask and unique=True, or call "
            "dedupe.apply_async(task, ...)"
        )
    if name in CALL_OPTIONS:
        return (
            f"declare the task with base=dedupe.DedupeTask, or call "
            f"dedupe.apply_async(task, ..., {name}=...)"
        )
    return f"declare the task with base=dedupe.DedupeTask and {name}=..."


def check_declared(task: type[AnyTask], task_name: str) -> None:
    """Check a DedupeTask's declared options when Celery registers it: a misspelt name, a
    name of the family this version lacks, a value out of range. The app's settings are not
    read yet (only their defaults), so a task-level value is judged on its own."""
    check_names(f"task {task_name!r}", _declared(task), TASK_OPTIONS)
    resolve(cast("AnyTask", task), task_name, _DEFAULTS)
    if _latest_declared(task) and _declared_false(task, "unique"):
        option = "debounce" if getattr(task, "debounce", None) is not None else "on_duplicate"
        raise ConfigurationError(
            f"task {task_name!r}: {option} declared on the task applies to every call of it, "
            f"which unique=False says not to deduplicate: drop unique=False (every call "
            f"then takes the {option}), or drop {option} from the task and pass it per call "
            f"(delay_unique, apply_async_unique(..., {option}=...))"
        )


def dedupes_every_call(task: object) -> bool:
    """Is every call of ``task`` deduplicated (its ``delay`` as its ``delay_unique``)? A
    task declared ``unique=True``, or with a debounce or a replace: options that would
    otherwise apply to some calls and be silently ignored by the rest."""
    return getattr(task, "unique", False) is True or _latest_declared(task)


def _latest_declared(task: object) -> bool:
    return (
        getattr(task, "debounce", None) is not None
        or getattr(task, "on_duplicate", None) == "replace"
    )


def _declared_false(task: type[AnyTask], name: str) -> bool:
    # Set to False by the task's own classes (the decorator's, the user's bases), not
    # inherited from DedupeTask's default.
    return any(
        vars(klass).get(name, None) is False
        for klass in task.__mro__
        if not klass.__module__.startswith(("dedupe.", "celery.", "builtins"))
    )


def check_plain_task(task: type[AnyTask], task_name: str) -> None:
    """Refuse a task that is no DedupeTask but was declared with an option of celery-dedupe
    (``@app.task(unique=True)``: it would deduplicate nothing). Only what the task's own class
    sets and no base defines: another library's base may own the same names (celery-singleton
    has ``unique_on`` and ``on_duplicate``)."""
    inherited = {name for klass in task.__mro__[1:] for name in vars(klass)}
    check_names(f"task {task_name!r}", sorted(set(vars(task)) - inherited), ())


def _declared(task: type[AnyTask]) -> list[str]:
    # What the task's own classes (the decorator's, the user's bases) set: not Celery's.
    return sorted(
        {
            name
            for klass in task.__mro__
            if not klass.__module__.startswith(("dedupe.", "celery.", "builtins"))
            for name in vars(klass)
        }
    )


#: The app-wide defaults, for judging a task's own values before the app's settings are read.
_DEFAULTS = DedupeConfig(redis_url="")


def limit_header(
    options: UniqueOptions,
    key: str,
    task_name: str,
    args: Sequence[object] | None,
    kwargs: Mapping[str, object] | None,
) -> LimitHeader:
    """What a call of a limited task (``options.limited``) tells its run: its key, its kind
    and its limits (a callable ``key_concurrency`` called with the call's arguments)."""
    rate, concurrency = options.rate, options.concurrency
    limit = None if concurrency is None else concurrency_of(concurrency, task_name, args, kwargs)
    if rate is None:
        assert limit is not None
        return LimitHeader("concurrency", key, limit, 0.0, options.lease)
    if limit is None:
        return LimitHeader("rate", key, rate.count, rate.period, 0.0)
    return LimitHeader("both", key, limit, rate.period, options.lease, starts=rate.count)
