"""The producer guard for asyncio code: awaited round trips, the same records as sync."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery

import dedupe
from dedupe.demo.server import RedisServer

from .conftest import RedisFactory


@pytest.fixture
def job(app: Celery) -> Any:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def refresh_report(report_id: int) -> None: ...

    return refresh_report


@pytest.fixture
def stoppable_redis(redis_factory: RedisFactory) -> RedisServer:
    return redis_factory()


def test_a_burst_of_identical_async_calls_publishes_once(
    app: Celery, job: Any, queue_length: Any
) -> None:
    async def burst() -> list[Any]:
        return await asyncio.gather(*(dedupe.aapply_async(job, args=(7,)) for _ in range(50)))

    results = asyncio.run(burst())
    assert len({result.id for result in results}) == 1
    assert sum(not result.deduplicated for result in results) == 1
    assert queue_length(app) == 1


def test_async_and_sync_calls_meet_on_the_same_records(job: Any) -> None:
    first = asyncio.run(job.adelay_unique(8))
    assert first.deduplicated is False
    assert job.delay(8).id == first.id
    holder = asyncio.run(dedupe.alookup(job, (8,)))
    assert holder is not None
    assert holder.task_id == first.id
    assert asyncio.run(job.aapply_async_unique((8,))).id == first.id


def test_an_async_duplicate_can_raise(job: Any) -> None:
    first = job.delay(9)

    async def again() -> None:
        await job.aapply_async_unique((9,), on_duplicate="raise")

    with pytest.raises(dedupe.AlreadyQueued) as caught:
        asyncio.run(again())
    assert caught.value.task_id == first.id


def test_an_async_call_with_redis_down_publishes_anyway(
    make_app: Callable[..., Celery], stoppable_redis: RedisServer, queue_length: Any
) -> None:
    app = make_app(dedupe_redis_url=stoppable_redis.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    stoppable_redis.stop()
    result = asyncio.run(job.adelay_unique(1))
    assert result.deduplicated is False
    assert queue_length(app) == 1


def test_the_async_guard_never_blocks_the_event_loop(
    make_app: Callable[..., Celery], stoppable_redis: RedisServer, queue_length: Any
) -> None:
    # 200 guarded calls on 20 keys are in flight while the dedup Redis hangs:
    # their round trips wait, the loop does not. A ticker coroutine shows any blocking.
    app = make_app(dedupe_redis_url=stoppable_redis.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    async def scenario() -> tuple[float, int, list[Any]]:
        # A server under load has its connections open: warm the pool up first.
        await asyncio.gather(*(dedupe.alookup(job, (-i,)) for i in range(200)))
        gaps: list[float] = []
        ticks_while_paused = 0
        paused = False
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks_while_paused
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.005)
                now = time.monotonic()
                gaps.append(now - last)
                ticks_while_paused += paused
                last = now

        ticking = asyncio.create_task(ticker())
        stoppable_redis.pause()
        paused = True
        calls = asyncio.gather(*(job.aapply_async_unique((i % 20,)) for i in range(200)))
        # Paused until the loop has ticked 20 times: at once for calls that only await their
        # round trips, once their CPU work is done on a loaded machine; never while a round
        # trip blocks the loop (each would wait out its timeout between two ticks).
        deadline = time.monotonic() + 5.0
        while ticks_while_paused < 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        paused = False
        stoppable_redis.resume()
        results = await calls
        done.set()
        await ticking
        return max(gaps), ticks_while_paused, results

    largest_gap, ticks_while_paused, results = asyncio.run(scenario())
    # A round trip that blocked the loop would stop the ticker for its whole timeout (2 s).
    # Shorter gaps are the calls' own CPU (200 calls started at once), which a loaded machine
    # stretches: 0.48 s was seen with two suites side by side; half the timeout holds at
    # twice that.
    assert ticks_while_paused >= 20
    assert largest_gap < 1.0
    assert sum(not result.deduplicated for result in results) == 20
    assert queue_length(app) == 20


def test_a_caller_cancelled_while_its_message_is_sent_keeps_the_key_of_that_message(
    make_app: Callable[..., Celery], stoppable_redis: RedisServer, redis_url: str
) -> None:
    # A web request whose client goes away is cancelled. The publish runs in a thread that
    # a cancellation cannot stop: the message is sent anyway, so the key must stay with it
    # (freed, the next call would publish a second task).
    import redis

    app = make_app(broker=stoppable_redis.url, dedupe_redis_url=redis_url)
    broker = redis.Redis.from_url(stoppable_redis.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    async def scenario() -> tuple[Any, int]:
        await asyncio.to_thread(job.delay, 0)  # the broker connection is open
        stoppable_redis.pause()
        call = asyncio.ensure_future(dedupe.aapply_async(job, args=(11,)))
        await asyncio.sleep(0.3)  # the decision is made; the publish waits on the broker
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        stoppable_redis.resume()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and broker.llen(app.conf.task_default_queue) < 2:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        return await dedupe.alookup(job, (11,)), int(broker.llen(app.conf.task_default_queue))

    try:
        holder, queued = asyncio.run(scenario())
    finally:
        broker.close()
    assert queued == 2  # job(0), and the cancelled call's message
    assert holder is not None  # ... whose key is still live
