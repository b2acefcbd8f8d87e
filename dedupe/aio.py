"""The producer guard for asyncio code (FastAPI, Starlette, aiohttp, Django async views).

The dedup round trip is awaited on ``redis.asyncio``, so a burst of guarded calls never
blocks the event loop; the publish itself (kombu is synchronous) runs in the loop's default
executor. The records are the very ones the sync entry points read and write.

>>> result = await dedupe.aapply_async(refresh_report, args=(42,))
>>> result.deduplicated
False
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from celery import Celery
from celery.result import AsyncResult

from .errors import RedisUnavailable
from .plan import Plan, Publish, keys_for, options_for
from .producer import publisher_for, resolve_task
from .record import Holder
from .run import NO_RUN
from .runtime import runtime_of

__all__ = ["aapply_async", "alookup", "apublish_unique"]


# Decisions in flight: asyncio keeps only weak references to tasks.
_in_flight: set[asyncio.Future[AsyncResult[Any]]] = set()


async def apublish_unique(
    app: Celery,
    task: Any,
    task_name: str,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    options: dict[str, Any],
    publish: Publish,
) -> AsyncResult[Any]:
    """:func:`dedupe.producer.publish_unique`, awaitable.

    The decision and the publish run as one task that the caller's cancellation does not
    reach (a web request whose client went away): cancelled between the two, a call would
    leave a key with no message behind (callers answered with a task that never runs), or
    publish after freeing its key (a second task).
    """
    plan = Plan(app, task, task_name, args, kwargs, options, publish)
    if plan.kind in ("eager", "canvas"):
        return await asyncio.to_thread(plan.publish)
    decided = asyncio.ensure_future(_decide(plan))
    _in_flight.add(decided)
    decided.add_done_callback(_in_flight.discard)
    return await asyncio.shield(decided)


async def _decide(plan: Plan) -> AsyncResult[Any]:
    store = plan.runtime.async_store()
    if plan.kind == "continuation":
        try:
            # Outside any run, an event loop is no worker's main process: never act for
            # another run of the task id.
            token = plan.token if plan.token is not None else NO_RUN
            await store.requeue(plan.keys, plan.task_id, token, plan.record, plan.ttl_ms)
        except RedisUnavailable as exc:
            plan.requeue_failed(exc)
        return await _publish_or_cancel(plan)
    try:
        holder = await store.enqueue(plan.keys, plan.record, plan.ttl_ms)
    except RedisUnavailable as exc:
        plan.enqueue_failed(exc)
        return await asyncio.to_thread(plan.publish)
    if holder is not None:
        return plan.duplicate(holder)
    return await _publish_or_cancel(plan)


async def _publish_or_cancel(plan: Plan) -> AsyncResult[Any]:
    try:
        return await asyncio.to_thread(plan.publish)
    except BaseException:
        try:
            await plan.runtime.async_store().cancel(plan.keys, plan.task_id)
        except RedisUnavailable as exc:
            plan.cancel_failed(exc)
        raise


async def aapply_async(
    task_or_name: Any,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    app: Celery | None = None,
    **options: Any,
) -> AsyncResult[Any]:
    """:func:`dedupe.apply_async`, awaitable: the producer guard for async views.

    >>> result = await dedupe.aapply_async("reports.refresh", args=(42,), app=app)
    """
    task, name, app = resolve_task(task_or_name, app)
    publish = publisher_for(task, name, app)
    return await apublish_unique(app, task, name, args, kwargs, options, publish)


async def alookup(
    task_or_name: Any,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    app: Celery | None = None,
    **overrides: Any,
) -> Holder | None:
    """:func:`dedupe.lookup`, awaitable."""
    task, name, app = resolve_task(task_or_name, app)
    runtime = runtime_of(app)
    options = options_for(task, name, runtime.config, overrides)
    return await runtime.async_store().lookup(keys_for(runtime, task, name, options, args, kwargs))
