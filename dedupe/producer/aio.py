"""The producer guard for asyncio code (FastAPI, Starlette, aiohttp, Django async views).

The dedup round trip is awaited on ``redis.asyncio``, so a burst of guarded calls never
blocks the event loop; the publish itself (kombu is synchronous) runs in the loop's default
executor. The decision is :mod:`dedupe.producer.guard`'s own
:class:`~dedupe.producer.prepared_call.PreparedCall`; only the round trips differ.

```python
result = await dedupe.aapply_async(refresh_report, args=(42,))
result.deduplicated                                                # False
```
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from celery import Celery

from dedupe.errors import RedisUnavailable
from dedupe.runs.run import NO_RUN
from dedupe.store.replies import Requeue
from dedupe.surfaces import TaskOrName
from dedupe.values.record import Holder

from .guard import Call, keys_of_call
from .limited_publish import apublish_limited, is_limited
from .prepared_call import PreparedCall
from .result import DedupeResult

__all__ = ["aapply_async", "alookup", "apublish_unique"]


# Decisions in flight: asyncio keeps only weak references to tasks.
_in_flight: set[asyncio.Future[DedupeResult]] = set()


async def apublish_unique(call: Call) -> DedupeResult:
    """:func:`dedupe.producer.guard.publish_unique`, awaitable.

    The decision and the publish run as one task that the caller's cancellation does not
    reach (a web request whose client went away): cancelled between the two, a call would
    publish after freeing its key (a second task), or leave a provisional record that makes
    calls duplicates of a task that never runs until it expires.
    """
    if is_limited(call):
        return await apublish_limited(call)
    prepared = PreparedCall(call)
    if prepared.kind == "eager":
        return await asyncio.to_thread(prepared.publish)
    decided = asyncio.ensure_future(_decide(prepared))
    _in_flight.add(decided)
    decided.add_done_callback(_in_flight.discard)
    return await asyncio.shield(decided)


async def _decide(prepared: PreparedCall) -> DedupeResult:
    if prepared.writes_first:
        store = prepared.runtime.async_store()
        outcome: Holder | Requeue | None
        try:
            if prepared.kind == "continuation":
                # Outside any run, an event loop is no worker's main process: never act for
                # another run of the task id.
                token = prepared.hand_over()
                token = token if token is not None else NO_RUN
                outcome = await store.requeue(*prepared.requeue_arguments(token))
            elif prepared.latest is not None:
                keys, provisional, ttl_ms = prepared.enqueue_arguments()
                outcome = await store.enqueue_latest(keys, provisional, ttl_ms, prepared.latest)
            else:
                outcome = await store.enqueue(*prepared.enqueue_arguments())
        except RedisUnavailable as exc:
            prepared.first_write_failed(exc)
            return await asyncio.to_thread(prepared.publish_unrecorded)
        except BaseException:
            await asyncio.to_thread(prepared.withdraw_first_write)
            raise
        duplicate = prepared.first_write_done(outcome)
        if duplicate is not None:
            return duplicate
    # The publish, and whatever Redis work comes with it, in one thread: kombu blocks.
    return await asyncio.to_thread(prepared.publish_with_record)


async def aapply_async(
    task_or_name: TaskOrName,
    args: Sequence[object] | None = None,
    kwargs: Mapping[str, object] | None = None,
    *,
    app: Celery | None = None,
    **options: object,
) -> DedupeResult:
    """[`dedupe.apply_async`][dedupe.apply_async], awaitable: the producer guard for async
    views. A call of a task with ``key_concurrency`` or ``key_rate_limit`` is published as
    its ``delay`` would be (its place in line, or its start, then its message), in the
    default executor.

    ```python
    result = await dedupe.aapply_async("reports.refresh", args=(42,), app=app)
    ```
    """
    return await apublish_unique(Call.of(task_or_name, args, kwargs, options, app))


async def alookup(
    task_or_name: TaskOrName,
    args: Sequence[object] | None = None,
    kwargs: Mapping[str, object] | None = None,
    *,
    app: Celery | None = None,
    **overrides: object,
) -> Holder | None:
    """[`dedupe.lookup`][dedupe.lookup], awaitable."""
    runtime, keys = keys_of_call(task_or_name, args, kwargs, app, overrides)
    return await runtime.async_store().lookup(keys)
