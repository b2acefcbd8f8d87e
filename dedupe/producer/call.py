"""A call of a task as the producer entry points hand it over, and how to publish it
without deduplicating it again."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeAlias

from celery import Celery

from dedupe.compat.celery_private import current_app, unproxied
from dedupe.surfaces import AnyAsyncResult, AnyTask, TaskOrName

__all__ = [
    "Call",
    "Publish",
    "TaskPublish",
    "in_canvas",
    "new_task_id",
    "producer_block",
    "publisher_for",
    "resolve_task",
]

#: A call's options: Celery's apply_async options plus the dedup call options (``unique_ttl``,
#: ...), each of the kind its option takes.
CallOptions: TypeAlias = "dict[str, Any]"

#: Publishes a call: ``publish(args, kwargs, options)`` with Celery's apply_async options.
Publish: TypeAlias = (
    "Callable[[Sequence[object] | None, Mapping[str, object] | None, CallOptions], AnyAsyncResult]"
)


@dataclass(slots=True)
class Call:
    """One call of a task, as every producer entry point hands it over."""

    app: Celery
    #: The registered task object, or None for a name this process does not import.
    task: AnyTask | None
    task_name: str
    args: Sequence[object] | None
    kwargs: Mapping[str, object] | None
    #: Celery's apply_async options plus the dedup call options (``unique_ttl``, ...).
    options: CallOptions
    #: How to publish the call without deduplicating it again.
    publish: Publish

    @classmethod
    def of(
        cls,
        task_or_name: TaskOrName,
        args: Sequence[object] | None,
        kwargs: Mapping[str, object] | None,
        options: CallOptions,
        app: Celery | None = None,
    ) -> Call:
        """The call of a task, or of a task name (the ``send_task`` path)."""
        task, name, app = resolve_task(task_or_name, app)
        return cls(app, task, name, args, kwargs, options, publisher_for(task, name, app))


def resolve_task(
    task_or_name: TaskOrName, app: Celery | None
) -> tuple[AnyTask | None, str, Celery]:
    """(task object or None, task name, app) of a task or a task name."""
    if isinstance(task_or_name, str):
        app = app or current_app()
        return app.tasks.get(task_or_name), task_or_name, app
    # @shared_task gives a lazy Proxy: work with the task object behind it.
    task = unproxied(task_or_name)
    task_app: Celery = app or task.app
    return task, str(task.name), task_app


def publisher_for(
    task: AnyTask | None,
    name: str,
    app: Celery,
    send_task: Callable[..., AnyAsyncResult] | None = None,
) -> Publish:
    """How to publish a call of ``task`` (or of ``name`` when ``task`` is None) without
    deduplicating it again."""
    if task is None:
        send = send_task or app.send_task
        return lambda args, kwargs, options: send(
            name, args, dict(kwargs) if kwargs is not None else None, **options
        )
    # A DedupeTask's own apply_async would deduplicate a second time.
    publish: Publish | None = getattr(task, "_dedupe_publish", None)
    if publish is not None:
        return publish
    return TaskPublish(task)


class TaskPublish:
    """Publishes with ``task.apply_async`` (a class: a batch tells it from other publishes)."""

    __slots__ = ("task",)

    # (Any: celery-types takes a tuple and a dict for apply_async's arguments, Celery any
    # sequence and mapping.)
    def __init__(self, task: Any) -> None:
        self.task = task

    def __call__(
        self,
        args: Sequence[object] | None,
        kwargs: Mapping[str, object] | None,
        options: CallOptions,
    ) -> AnyAsyncResult:
        result: AnyAsyncResult = self.task.apply_async(args, kwargs, **options)
        return result


def new_task_id() -> str:
    """A new task id: a random UUID (version 4) in its usual text form, as Celery makes them.

    Formatted here from 16 random bytes: uuid.uuid4() builds a UUID object first, which
    costs a producer call more than the rest of its key and record together.
    """
    digits = os.urandom(16).hex()
    variant = "89ab"[int(digits[16], 16) & 3]
    return f"{digits[:8]}-{digits[8:12]}-4{digits[13:16]}-{variant}{digits[17:20]}-{digits[20:]}"


#: Celery's options that make a call a member of a canvas (a chain, a chord, a group, a link).
_CANVAS_OPTIONS = ("chain", "chord", "group_id", "link", "link_error")


def in_canvas(options: Mapping[str, object]) -> bool:
    """Is a call with ``options`` a canvas member (never refused: that would cut its
    workflow)?"""
    # A loop, not any(<generator>): this runs on every call, and the generator costs more.
    for name in _CANVAS_OPTIONS:  # noqa: SIM110
        if options.get(name) is not None:
            return True
    return False


def producer_block(call: Call) -> AbstractContextManager[Any]:
    """The producer ``call`` publishes through, for a ``with`` block: its ``producer`` option,
    else one of its app's pool (what Celery's producer_or_acquire does, without its second
    look at the settings). Any: celery-types types kombu's Producer apart from
    ProducerSurface."""
    given = call.options.get("producer")
    if given is None:
        acquired: AbstractContextManager[Any] = call.app.producer_pool.acquire(block=True)
        return acquired
    return nullcontext(given)
