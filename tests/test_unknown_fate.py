"""A dedup write whose fate is unknown never leaves a key that outlives its message.

The dedup Redis is frozen (SIGSTOP) while a call writes its record: the client gives up after
its timeouts and retries, and the server runs the buffered commands when it is resumed
(SIGCONT). Whatever it writes then is provisional: it names a task only for
``dedupe_provisional_ttl``, unless the message was published with it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.exceptions import OperationalError

import dedupe
from dedupe.demo.server import RedisServer

from .conftest import RedisFactory, in_process_worker
from .helpers import FAILS_AT_ONCE, UNREACHABLE, keys_with_prefix, wait_for

pytestmark = pytest.mark.slow

PROVISIONAL_TTL = 2.0
# Short client timeouts: a call on the frozen server gives up within about a second.
FAST_FAILING = {"socket_timeout": 0.3, "socket_connect_timeout": 0.3}

QueueLength = Callable[[Celery], int]


@pytest.fixture
def freezable(redis_factory: RedisFactory) -> RedisServer:
    return redis_factory()


def _app(make_app: Callable[..., Celery], dedup: RedisServer, **conf: Any) -> tuple[Celery, Any]:
    app = make_app(
        dedupe_redis_url=dedup.url,
        dedupe_provisional_ttl=PROVISIONAL_TTL,
        **{"dedupe_redis_options": FAST_FAILING, **conf},
    )

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    return app, job


def _warm_up(job: Any) -> None:
    """Connect and load the scripts (a frozen EVALSHA of an unloaded script would meet
    NOSCRIPT when the server resumes, and run nothing), leaving no key."""
    job.delay(0)
    assert dedupe.clear(job, (0,))


def _keys_after_resume(dedup: RedisServer, app: Celery) -> dict[bytes, int]:
    """Resume the server; once it has run what it buffered, every key with its pttl."""
    dedup.resume()
    client = redis.Redis.from_url(dedup.url)
    client.ping()  # answered after the buffered commands of older connections
    time.sleep(0.2)
    prefix = app.conf.dedupe_key_prefix
    return {key: int(client.pttl(key)) for key in keys_with_prefix(client, prefix)}


def _no_key_left(dedup: RedisServer, app: Celery) -> None:
    client = redis.Redis.from_url(dedup.url)
    wait_for(
        lambda: keys_with_prefix(client, app.conf.dedupe_key_prefix) == [],
        timeout=PROVISIONAL_TTL + 2,
        message="no key past the provisional ttl",
    )


def _provisional(keys: dict[bytes, int]) -> bool:
    """What the frozen call left when the server resumed is provisional, or nothing (its
    cancel ran after its write: Redis reads the resumed connections in any order)."""
    return keys == {} or (
        len(keys) == 1 and 0 < next(iter(keys.values())) <= PROVISIONAL_TTL * 1000
    )


def test_a_raising_call_on_a_frozen_redis_leaves_no_key_past_the_provisional_ttl(
    make_app: Callable[..., Celery],
    broker: str,
    freezable: RedisServer,
    queue_length: QueueLength,
) -> None:
    app, job = _app(make_app, freezable, broker=broker, dedupe_on_redis_error="raise")
    _warm_up(job)
    freezable.pause()
    with pytest.raises(dedupe.RedisUnavailable):
        job.delay(1)
    assert _provisional(_keys_after_resume(freezable, app))
    assert queue_length(app) == 1  # the warm-up's message only
    _no_key_left(freezable, app)


def test_an_enqueue_anyway_call_on_a_frozen_redis_leaves_only_a_provisional_key(
    make_app: Callable[..., Celery],
    broker: str,
    freezable: RedisServer,
    queue_length: QueueLength,
) -> None:
    app, job = _app(make_app, freezable, broker=broker, dedupe_on_redis_error="enqueue")
    _warm_up(job)
    freezable.pause()
    assert job.delay(1).deduplicated is False
    assert queue_length(app) == 2  # published without dedup
    assert _provisional(_keys_after_resume(freezable, app))
    _no_key_left(freezable, app)


def test_an_enqueue_anyway_call_whose_publish_fails_too_leaves_no_key(
    make_app: Callable[..., Celery], freezable: RedisServer
) -> None:
    app, job = _app(
        make_app,
        freezable,
        broker=UNREACHABLE,
        dedupe_on_redis_error="enqueue",
        **FAILS_AT_ONCE,
    )
    with pytest.raises(OperationalError):
        job.delay(0)  # connects and loads the scripts; its publish fails and cancels
    freezable.pause()
    with pytest.raises(OperationalError):
        job.delay(1)
    assert _provisional(_keys_after_resume(freezable, app))
    _no_key_left(freezable, app)


def test_an_asyncio_call_on_a_frozen_redis_leaves_no_key_past_the_provisional_ttl(
    make_app: Callable[..., Celery],
    broker: str,
    freezable: RedisServer,
    queue_length: QueueLength,
) -> None:
    app, job = _app(make_app, freezable, broker=broker, dedupe_on_redis_error="raise")

    async def calls() -> None:
        await dedupe.aapply_async(job, (0,))
        assert await asyncio.to_thread(dedupe.clear, job, (0,))
        freezable.pause()
        with pytest.raises(dedupe.RedisUnavailable):
            await dedupe.aapply_async(job, (1,))

    asyncio.run(calls())
    assert _provisional(_keys_after_resume(freezable, app))
    assert queue_length(app) == 1
    _no_key_left(freezable, app)


def test_a_one_step_publish_of_unknown_fate_leaves_its_record_and_message_or_neither(
    make_app: Callable[..., Celery], freezable: RedisServer
) -> None:
    # The frozen Redis is the broker and the dedup store: one script writes both.
    app, job = _app(make_app, freezable, broker=freezable.url, dedupe_on_redis_error="enqueue")
    assert dedupe.runs.runtime.installed(app).broker_is_store  # type: ignore[union-attr]
    _warm_up(job)
    freezable.pause()
    with pytest.raises(dedupe.RedisUnavailable):
        job.delay(1)
    keys = _keys_after_resume(freezable, app)
    client = redis.Redis.from_url(freezable.url)
    queued = client.lrange(app.conf.task_default_queue, 0, -1)
    holder = dedupe.lookup(job, (1,))
    assert len(keys) == 1  # the script ran when the server resumed ...
    assert holder is not None
    assert len(queued) == 2  # ... and pushed the message it names
    assert holder.task_id.encode() in queued[0]


def test_a_claim_that_lands_after_the_worker_gave_up_is_freed_when_the_run_ends(
    make_app: Callable[..., Celery], broker: str, freezable: RedisServer
) -> None:
    app = make_app(
        broker=broker,
        dedupe_redis_url=freezable.url,
        dedupe_redis_options=FAST_FAILING,
        dedupe_default_lease=60,
    )
    gate, started = threading.Event(), threading.Event()

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None:
        started.set()
        gate.wait(20)

    client = redis.Redis.from_url(freezable.url)
    with in_process_worker(app):
        gate.set()
        job.delay(0).get(timeout=10)  # loads the claim and release scripts
        # The result is stored before the run's release is sent: wait until the server ran
        # it. A release still in flight when the server froze would hold the worker's claim
        # back behind its unread reply (the claim would never leave the client at all).
        wait_for(lambda: dedupe.lookup(job, (0,)) is None, message="the warm-up's release")
        gate.clear()
        started.clear()
        job.apply_async((1,), countdown=1)  # reaches the worker now, claims in a second
        freezable.pause()
        assert started.wait(15), "the run never started"  # unguarded, the claim timed out
        freezable.resume()
        client.ping()
        wait_for(
            lambda: (h := dedupe.lookup(job, (1,))) is not None and h.state == "running",
            timeout=3,
            message="the claim the worker gave up on landed when the server resumed",
        )
        gate.set()
        wait_for(
            lambda: dedupe.lookup(job, (1,)) is None,
            timeout=5,
            message="the landed claim freed when the run ended (not held for its lease)",
        )


# Timeouts far longer than the budget: a call that gives up within them was cut by the budget.
SLOW_FAILING = {"socket_timeout": 10, "socket_connect_timeout": 10}
BUDGET = 1.0


def _on_a_budget(
    make_app: Callable[..., Celery], broker: str, freezable: RedisServer
) -> tuple[Celery, Any]:
    app, job = _app(
        make_app,
        freezable,
        broker=broker,
        dedupe_on_redis_error="raise",
        dedupe_call_budget=BUDGET,
        dedupe_redis_options=SLOW_FAILING,
    )
    return app, job


def test_a_call_on_a_frozen_redis_gives_up_within_its_budget_not_its_timeouts(
    make_app: Callable[..., Celery], broker: str, freezable: RedisServer
) -> None:
    _, job = _on_a_budget(make_app, broker, freezable)
    _warm_up(job)
    freezable.pause()
    started = time.monotonic()
    with pytest.raises(dedupe.RedisUnavailable, match=r"call budget|Timeout"):
        job.delay(1)
    elapsed = time.monotonic() - started
    assert elapsed < SLOW_FAILING["socket_timeout"], f"gave up after {elapsed:.2f} s"
    freezable.resume()


def test_an_asyncio_call_on_a_frozen_redis_gives_up_within_its_budget_not_its_timeouts(
    make_app: Callable[..., Celery], broker: str, freezable: RedisServer
) -> None:
    _, job = _on_a_budget(make_app, broker, freezable)

    async def call(x: int) -> Any:
        return await job.aapply_async_unique((x,))

    asyncio.run(call(0))
    assert dedupe.clear(job, (0,))
    freezable.pause()
    started = time.monotonic()
    with pytest.raises(dedupe.RedisUnavailable):
        asyncio.run(call(1))
    elapsed = time.monotonic() - started
    assert elapsed < SLOW_FAILING["socket_timeout"], f"gave up after {elapsed:.2f} s"
    freezable.resume()
