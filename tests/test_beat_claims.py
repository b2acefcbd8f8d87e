"""A beat's claim of a tick whose answer is late or unread: a claim the client sent again
after its reply came too late is still this beat's (its resend meets it), and a refused
claim whose holder cannot be read is another beat's; the claim of a tick whose send failed
once its message was out stays. Real Redis and RabbitMQ behind a proxy that holds or cuts
what the test names."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.beat import ScheduleEntry, SchedulingError
from celery.schedules import crontab, schedule

from dedupe import DedupeTask
from dedupe.beat import DedupeScheduler
from dedupe.beat.ticks import tick_of
from dedupe.values.keys import tick_key

from .conftest import RedisFactory
from .helpers import BASIC_PUBLISH, CONFIRMED_ONCE, Clock, full_queue
from .proxies import RABBITMQ_PORT, CuttingProxy, HoldingProxy

#: Where the tests' clocks start: a hair into a minute, so that a hair less than an interval
#: on is still inside the slot claimed.
_START = dt.datetime(2026, 11, 24, 9, 0, 0, 100, tzinfo=dt.timezone.utc)


def _entry(app: Celery, every: Any) -> Any:
    return ScheduleEntry(
        name="e", task="x.y", schedule=every, args=(1,), options={"unique": False}, app=app
    )


def test_an_interval_tick_whose_next_slot_claim_is_answered_late_is_sent(
    make_app: Callable[..., Celery], redis_factory: RedisFactory, tmp_path: Path, queue_length: Any
) -> None:
    # Due again a hair inside the slot it claimed, the beat claims the next slot; that
    # claim landed, its answer came after the socket timeout, and the resend met it.
    proxy = HoldingProxy(redis_factory().port, hold_for=1.0)
    try:
        app = make_app(dedupe_redis_url=proxy.url, dedupe_redis_options={"socket_timeout": 0.5})
        clock = Clock(_START)
        scheduler = DedupeScheduler(app=app, schedule_filename=str(tmp_path / "s"))
        entry = _entry(app, schedule(60.0, nowfun=clock, app=app))
        assert scheduler.apply_async(entry) is not None
        clock.at += dt.timedelta(seconds=59.9998)  # (the same slot, a hair before its end)
        tick = tick_of(entry.schedule)
        assert tick is not None
        assert tick.following is not None
        following = tick_key(app.conf.dedupe_key_prefix, "e", tick.following)
        proxy.hold_at = (following.encode(),)
        assert scheduler.apply_async(entry) is not None
        assert proxy.held == 1
        assert queue_length(app) == 2
    finally:
        proxy.close()


def test_a_refused_tick_claim_whose_holder_cannot_be_read_is_skipped(
    make_app: Callable[..., Celery], redis_factory: RedisFactory, tmp_path: Path, queue_length: Any
) -> None:
    # Refused: another beat holds the tick. Whether the holder is this claim's own resend
    # cannot be read, so the tick is left to the beat that holds it (never sent unclaimed).
    proxy = CuttingProxy(redis_factory().port, every=True)
    try:
        app = make_app(dedupe_redis_url=proxy.url, dedupe_redis_options={"socket_timeout": 0.5})
        clock = Clock(_START)
        every = crontab(minute="*/5", nowfun=clock, app=app)
        first, second = (
            DedupeScheduler(app=app, schedule_filename=str(tmp_path / f"s{n}")) for n in (1, 2)
        )
        assert first.apply_async(_entry(app, every)) is not None
        proxy.cut_at = (b"GET", f"{app.conf.dedupe_key_prefix}:beat:".encode())
        assert second.apply_async(_entry(app, every)) is None
        assert proxy.cuts >= 1
        assert queue_length(app) == 1
    finally:
        proxy.close()


def test_a_tick_whose_send_fails_after_its_message_went_out_keeps_its_claim(
    make_app: Callable[..., Celery], rabbitmq_url: str, tmp_path: Path, queue_length: Any
) -> None:
    # RabbitMQ gets the message, and the connection dies before its confirm comes back: the
    # send raises, but the tick is out. Freed, its claim would let another beat send it again.
    proxy = CuttingProxy(RABBITMQ_PORT, delivered=True)
    try:
        app = make_app(broker=proxy.amqp_url, **CONFIRMED_ONCE)
        clock = Clock(_START)
        every = crontab(minute="*/5", nowfun=clock, app=app)
        first, second = (
            DedupeScheduler(app=app, schedule_filename=str(tmp_path / f"s{n}")) for n in (1, 2)
        )
        proxy.cut_at = (BASIC_PUBLISH, app.conf.task_default_queue.encode())
        with pytest.raises(SchedulingError):
            first.apply_async(_entry(app, every))
        assert proxy.cuts == 1
        assert second.apply_async(_entry(app, every)) is None
        assert queue_length(app) == 1
    finally:
        proxy.close()


def test_a_tick_the_broker_refuses_gives_its_claim_up(
    make_app: Callable[..., Celery], rabbitmq_url: str, tmp_path: Path, redis_client: Any
) -> None:
    # A full queue that rejects publishes: RabbitMQ answers the tick with a Nack, so it is
    # surely not out, and another beat may send it.
    app = make_app(**full_queue(rabbitmq_url))
    scheduler = DedupeScheduler(app=app, schedule_filename=str(tmp_path / "s"))
    clock = Clock(_START)
    every = crontab(minute="*/5", nowfun=clock, app=app)
    app.send_task("x.y", (0,))  # (fills the queue)
    with pytest.raises(SchedulingError):
        scheduler.apply_async(_entry(app, every))
    tick = tick_of(every)
    assert tick is not None
    assert redis_client.exists(tick_key(app.conf.dedupe_key_prefix, "e", tick.number)) == 0


def test_a_limited_tick_whose_one_step_push_goes_unanswered_keeps_its_claim(
    make_app: Callable[..., Celery], redis_factory: RedisFactory, tmp_path: Path
) -> None:
    # On a Redis broker that is the store, a key_concurrency tick's place in line and its
    # message are one script. Its reply lost, the script may have pushed the tick: freed,
    # its claim would let another beat send it again (a limited task accepts every call).
    server = redis_factory()
    proxy = CuttingProxy(server.port, delivered=True)
    try:
        app = make_app(broker=proxy.url, dedupe_redis_url=proxy.url)

        @app.task(name="x.y", shared=False, base=DedupeTask, key_concurrency=1)
        def limited(n: int) -> None: ...

        clock = Clock(_START)
        every = crontab(minute="*/5", nowfun=clock, app=app)
        first, second = (
            DedupeScheduler(app=app, schedule_filename=str(tmp_path / f"s{n}")) for n in (1, 2)
        )
        limited.delay(0)  # (the script is loaded: the cut one runs)
        proxy.cut_at = (b"EVALSHA", app.conf.task_default_queue.encode())
        with pytest.raises(SchedulingError):
            first.apply_async(_entry(app, every))
        assert proxy.cuts == 1
        assert second.apply_async(_entry(app, every)) is None
        assert redis.Redis(port=server.port).llen(app.conf.task_default_queue) == 2
    finally:
        proxy.close()
