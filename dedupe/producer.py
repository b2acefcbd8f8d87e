"""Enqueue-time dedup: decide before publishing whether a call is new or a duplicate.

An accepted call costs one round trip (the ``enqueue`` script) plus the publish; a duplicate
costs that one round trip and builds no message. The decision comes before
``app.send_task``, so a refused call leaves no result subscription behind either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery import Celery
from celery._state import get_current_app
from celery.result import AsyncResult

from .errors import RedisUnavailable
from .plan import Plan, Publish, keys_for, options_for
from .record import Holder
from .run import main_process_token
from .runtime import runtime_of

__all__ = [
    "Publish",
    "apply_async",
    "lookup",
    "publish_unique",
    "publisher_for",
    "release",
    "resolve_task",
]


def publish_unique(
    app: Celery,
    task: Any,
    task_name: str,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    options: dict[str, Any],
    publish: Publish,
) -> AsyncResult[Any]:
    """Publish a call unless its key is live; the engine behind every producer entry point.

    ``options`` are Celery's apply_async options plus the dedup call options; ``task`` is
    the registered task object, or None for a name this process does not know.
    """
    plan = Plan(app, task, task_name, args, kwargs, options, publish)
    if plan.kind in ("eager", "canvas"):
        return plan.publish()
    store = plan.store
    if plan.kind == "continuation":
        try:
            token = plan.token
            if token is None:
                token = main_process_token(store, plan.keys)
            store.requeue(plan.keys, plan.task_id, token, plan.record, plan.ttl_ms)
        except RedisUnavailable as exc:
            plan.requeue_failed(exc)
        return _publish_or_cancel(plan)
    try:
        holder = store.enqueue(plan.keys, plan.record, plan.ttl_ms)
    except RedisUnavailable as exc:
        plan.enqueue_failed(exc)
        return plan.publish()
    if holder is not None:
        return plan.duplicate(holder)
    return _publish_or_cancel(plan)


def _publish_or_cancel(plan: Plan) -> AsyncResult[Any]:
    try:
        return plan.publish()
    except BaseException:
        # The message may not exist: free the key so the caller's retry is not refused.
        try:
            plan.store.cancel(plan.keys, plan.task_id)
        except RedisUnavailable as exc:
            plan.cancel_failed(exc)
        raise


def resolve_task(task_or_name: Any, app: Celery | None) -> tuple[Any, str, Celery]:
    """(task object or None, task name, app) of a task or a task name."""
    if isinstance(task_or_name, str):
        app = app or get_current_app()
        return app.tasks.get(task_or_name), task_or_name, app
    # @shared_task gives a lazy Proxy: work with the task object behind it.
    unwrap = getattr(task_or_name, "_get_current_object", None)
    task = unwrap() if callable(unwrap) else task_or_name
    task_app: Celery = app or task.app
    return task, str(task.name), task_app


def publisher_for(
    task: Any, name: str, app: Celery, send_task: Callable[..., AsyncResult[Any]] | None = None
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
    return lambda args, kwargs, options: task.apply_async(args, kwargs, **options)


def apply_async(
    task_or_name: Any,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    app: Celery | None = None,
    **options: Any,
) -> AsyncResult[Any]:
    """Publish a call of any task unless the same call is already queued or running.

    The producer guard: works for a task of any base class and for a task name this
    process does not import (the ``send_task`` path). ``options`` are Celery's apply_async
    options plus ``unique_on``, ``unique_key``, ``unique_ttl``, ``unique_until`` and
    ``on_duplicate``.

    >>> result = dedupe.apply_async(refresh_report, args=(42,))
    >>> result.deduplicated
    False
    >>> dedupe.apply_async("reports.refresh", args=(42,), app=app).deduplicated
    True
    """
    task, name, app = resolve_task(task_or_name, app)
    return publish_unique(app, task, name, args, kwargs, options, publisher_for(task, name, app))


def lookup(
    task_or_name: Any,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    app: Celery | None = None,
    **overrides: Any,
) -> Holder | None:
    """The task holding the key of a call (``.task_id``, ``.state``, ``.ttl``), or None.

    >>> holder = dedupe.lookup(refresh_report, args=(42,))
    >>> holder.state if holder else "free"
    'queued'
    """
    task, name, app = resolve_task(task_or_name, app)
    runtime = runtime_of(app)
    options = options_for(task, name, runtime.config, overrides)
    return runtime.store.lookup(keys_for(runtime, task, name, options, args, kwargs))


def release(
    task_or_name: Any,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    app: Celery | None = None,
    **overrides: Any,
) -> bool:
    """Force-clear the key of a call, whoever holds it. True if a key was deleted.

    A run still holding the key keeps running; its heartbeat re-creates the key.

    >>> dedupe.release(refresh_report, args=(42,))
    True
    """
    task, name, app = resolve_task(task_or_name, app)
    runtime = runtime_of(app)
    options = options_for(task, name, runtime.config, overrides)
    return runtime.store.clear(keys_for(runtime, task, name, options, args, kwargs))
