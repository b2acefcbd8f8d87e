"""The deduplicating scheduler, driven in this process (no beat subprocess)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.beat import BeatLazyFunc, ScheduleEntry, SchedulingError
from celery.schedules import crontab, schedule

import dedupe
from dedupe.beat import DedupeScheduler
from dedupe.producer.guard import keys_of_call
from dedupe.store.store import Store
from dedupe.values.limits import limit_keys

from .conftest import RedisFactory
from .helpers import FAILS_AT_ONCE, UNREACHABLE, Clock
from .proxies import HoldingProxy


class NextTickScheduler(DedupeScheduler):
    """Each send is the entry's next tick: its clock moves one interval first."""

    clock: Clock

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **kw: Any) -> Any:
        self.clock.advance(60.0)
        return super().apply_async(entry, producer, advance, **kw)


@pytest.fixture
def beat(app: Celery, tmp_path: Path) -> Callable[..., Any]:
    """Make a scheduler for ``app`` and an entry for it that fires every minute; each of
    the scheduler's sends is a tick of its own."""

    def make(task: str, args: tuple[Any, ...] = (), **options: Any) -> tuple[DedupeScheduler, Any]:
        scheduler = NextTickScheduler(app=app, schedule_filename=str(tmp_path / "schedule"))
        scheduler.clock = Clock()
        every_minute = schedule(60.0, nowfun=scheduler.clock, app=app)
        entry = ScheduleEntry(
            name="every-minute",
            task=task,
            schedule=every_minute,
            args=args,
            options=options,
            app=app,
        )
        return scheduler, entry

    return make


@pytest.fixture
def beats(app: Celery, tmp_path: Path) -> Callable[..., Any]:
    """Make ``count`` schedulers for ``app`` (beat processes side by side, each with its
    own schedule file) and one entry on ``every`` they share, on a clock the test moves."""

    def make(
        task: str, every: Any, count: int = 2, args: tuple[Any, ...] = (1,), **options: Any
    ) -> tuple[list[Any], Any]:
        schedulers = [
            DedupeScheduler(app=app, schedule_filename=str(tmp_path / f"schedule-{n}"))
            for n in range(count)
        ]
        entry = ScheduleEntry(
            name="shared", task=task, schedule=every, args=args, options=options, app=app
        )
        return schedulers, entry

    return make


@pytest.fixture
def tasks(app: Celery) -> Any:
    class Tasks:
        @staticmethod
        @app.task(shared=False, name="jobs.refresh")
        def refresh(report_id: int, full: bool = False) -> None: ...

        @staticmethod
        @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="jobs.unique_refresh")
        def unique_refresh(report_id: int) -> None: ...

        @staticmethod
        @app.task(
            shared=False,
            base=dedupe.DedupeTask,
            unique=True,
            on_duplicate="raise",
            name="jobs.strict_refresh",
        )
        def strict_refresh(report_id: int) -> None: ...

        @staticmethod
        @app.task(
            shared=False,
            base=dedupe.DedupeTask,
            key_concurrency=1,
            unique_on=("report_id",),
            name="jobs.limited_refresh",
        )
        def limited_refresh(report_id: int) -> None: ...

    return Tasks


def test_an_entry_is_not_sent_while_its_previous_run_is_queued(
    app: Celery, tasks: Any, beat: Any, queue_length: Any, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler, entry = beat("jobs.refresh", (1,))
    first = scheduler.apply_async(entry)
    with caplog.at_level(logging.INFO, logger="dedupe.beat"):
        second = scheduler.apply_async(entry)
    assert (first.deduplicated, second.deduplicated) == (False, True)
    assert second.id == first.id
    assert queue_length(app) == 1
    assert scheduler.dedupe_skipped["every-minute"] == 1
    assert "not sending every-minute (jobs.refresh)" in caplog.text
    assert first.id in caplog.text


def test_a_manual_call_and_the_entry_share_the_key(tasks: Any, beat: Any) -> None:
    manual = dedupe.apply_async(tasks.refresh, args=(2,), kwargs={"full": False})
    scheduler, entry = beat("jobs.refresh", (2,))
    sent = scheduler.apply_async(entry)
    assert sent.deduplicated
    assert sent.id == manual.id


def test_a_unique_task_entry_is_deduplicated_through_one_guard(
    app: Celery, tasks: Any, beat: Any, queue_length: Any
) -> None:
    scheduler, entry = beat("jobs.unique_refresh", (3,))
    first = scheduler.apply_async(entry)
    assert tasks.unique_refresh.delay(3).id == first.id
    assert scheduler.apply_async(entry).deduplicated
    assert queue_length(app) == 1


# Entries stored as JSON (django-celery-beat, RedBeat) may spell False as a string.
@pytest.mark.parametrize("unique", [False, "false"])
def test_an_entry_can_opt_out(
    app: Celery, tasks: Any, beat: Any, queue_length: Any, unique: Any
) -> None:
    scheduler, entry = beat("jobs.refresh", (4,), unique=unique)
    scheduler.apply_async(entry)
    scheduler.apply_async(entry)
    assert queue_length(app) == 2


def test_an_opted_out_entry_of_a_unique_task_sends_without_dedup_options(
    app: Celery, tasks: Any, beat: Any, queue_length: Any
) -> None:
    # unique_on next to unique=False must not reach DedupeTask.apply_async, which refuses
    # dedup options on a call that is not deduplicated.
    scheduler, entry = beat("jobs.unique_refresh", (4,), unique=False, unique_on=("report_id",))
    first = scheduler.apply_async(entry)
    second = scheduler.apply_async(entry)
    assert first.id != second.id
    assert queue_length(app) == 2
    assert dedupe.lookup(tasks.unique_refresh, (4,)) is None


def test_a_task_declared_on_duplicate_raise_is_skipped_not_an_error(
    app: Celery, tasks: Any, beat: Any, queue_length: Any
) -> None:
    scheduler, entry = beat("jobs.strict_refresh", (8,))
    first = scheduler.apply_async(entry)
    second = scheduler.apply_async(entry)
    assert second.deduplicated
    assert second.id == first.id
    assert scheduler.dedupe_skipped["every-minute"] == 1
    assert queue_length(app) == 1


def test_dedup_options_in_the_dedupe_header_reach_the_key(
    redis_app: Celery, redis_client: Any, tmp_path: Path
) -> None:
    import json

    # How a django-celery-beat PeriodicTask (whose entries carry only fixed options, but
    # any headers) sets per-entry options.
    @redis_app.task(shared=False, name="jobs.by_report")
    def by_report(report_id: int, full: bool = False) -> None: ...

    scheduler = DedupeScheduler(app=redis_app, schedule_filename=str(tmp_path / "s"))
    entry = ScheduleEntry(
        name="e",
        task="jobs.by_report",
        schedule=60.0,
        args=(9,),
        kwargs={"full": True},
        options={"headers": {"dedupe": {"unique_on": ["report_id"], "unique_ttl": 30}}},
        app=redis_app,
    )
    first = scheduler.apply_async(entry)
    holder = dedupe.lookup(by_report, (9,), unique_on=("report_id",))
    assert holder is not None
    assert holder.task_id == first.id
    assert holder.ttl is not None
    assert holder.ttl <= 30
    (raw,) = redis_client.lrange(redis_app.conf.task_default_queue, 0, -1)
    assert "dedupe" not in json.loads(raw)["headers"]


def test_a_dedupe_header_can_opt_an_entry_out(
    app: Celery, tasks: Any, beat: Any, queue_length: Any
) -> None:
    scheduler, entry = beat("jobs.refresh", (10,), headers={"dedupe": {"unique": False}})
    scheduler.apply_async(entry)
    scheduler.apply_async(entry)
    assert queue_length(app) == 2


def test_entry_options_reach_the_key(tasks: Any, beat: Any) -> None:
    scheduler, entry = beat("jobs.refresh", (5,), unique_on=("report_id",), unique_ttl=30)
    first = scheduler.apply_async(entry)
    holder = dedupe.lookup(tasks.refresh, (5,), {"full": True}, unique_on=("report_id",))
    assert holder is not None
    assert holder.task_id == first.id
    assert holder.ttl is not None
    assert holder.ttl <= 30


def test_an_entry_for_a_task_this_process_does_not_import_is_deduplicated(
    app: Celery, beat: Any, queue_length: Any
) -> None:
    scheduler, entry = beat("elsewhere.nightly", (6,))
    first = scheduler.apply_async(entry)
    assert scheduler.apply_async(entry).id == first.id
    assert queue_length(app) == 1


def test_the_beat_header_is_set_and_the_entry_is_left_untouched(
    redis_app: Celery, redis_client: Any, tmp_path: Path
) -> None:
    import json

    scheduler = DedupeScheduler(app=redis_app, schedule_filename=str(tmp_path / "s"))
    entry = ScheduleEntry(
        name="e",
        task="x.y",
        schedule=60.0,
        args=(1,),
        options={"headers": {"mine": 1}},
        app=redis_app,
    )
    scheduler.apply_async(entry)
    (raw,) = redis_client.lrange(redis_app.conf.task_default_queue, 0, -1)
    headers = json.loads(raw)["headers"]
    assert headers["celery_beat_task"] is True
    assert headers["mine"] == 1
    assert "celery_dedupe" in headers
    assert entry.options == {"headers": {"mine": 1}}


def test_redis_down_with_raise_is_a_scheduling_error_beat_survives(
    make_app: Callable[..., Celery], redis_factory: RedisFactory, tmp_path: Path
) -> None:
    down = redis_factory(start=False)
    app = make_app(dedupe_redis_url=down.url, dedupe_on_redis_error="raise")
    scheduler = DedupeScheduler(app=app, schedule_filename=str(tmp_path / "s"))
    entry = ScheduleEntry(name="e", task="x.y", schedule=60.0, args=(1,), app=app)
    with pytest.raises(SchedulingError, match="Couldn't apply scheduled task e"):
        scheduler.apply_async(entry)


def test_beats_side_by_side_send_one_tick_once(
    app: Celery, beats: Any, queue_length: Any, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    (first, second), entry = beats("jobs.refresh", schedule(60.0, nowfun=clock, app=app))
    sent = first.apply_async(entry)
    clock.advance(20.0)  # the second beat fires later in the same minute
    with caplog.at_level(logging.INFO, logger="dedupe.beat"):
        skipped = second.apply_async(entry)
    assert sent is not None
    assert not sent.deduplicated
    assert skipped is None
    assert queue_length(app) == 1
    assert second.dedupe_ticks_skipped["shared"] == 1
    assert "not sending shared (jobs.refresh): another beat sent this tick" in caplog.text


def test_the_next_tick_is_sent_by_whichever_beat_fires_first(
    app: Celery, beats: Any, queue_length: Any
) -> None:
    clock = Clock()
    (first, second), entry = beats(
        "jobs.refresh", schedule(60.0, nowfun=clock, app=app), unique=False
    )
    first.apply_async(entry)
    clock.advance(60.0)
    assert second.apply_async(entry) is not None
    assert first.apply_async(entry) is None
    assert queue_length(app) == 2


def test_an_opted_out_entry_still_sends_each_tick_once(
    app: Celery, beats: Any, queue_length: Any
) -> None:
    clock = Clock()
    schedulers, entry = beats(
        "jobs.refresh", schedule(60.0, nowfun=clock, app=app), count=3, unique=False
    )
    results = [scheduler.apply_async(entry) for scheduler in schedulers]
    assert sum(result is not None for result in results) == 1
    assert queue_length(app) == 1


def test_beats_side_by_side_send_one_crontab_occurrence_once(
    app: Celery, beats: Any, queue_length: Any
) -> None:
    clock = Clock()
    schedulers, entry = beats(
        "jobs.refresh", crontab(minute="*/5", nowfun=clock, app=app), count=3, unique=False
    )
    sends = []
    for scheduler in schedulers:
        sends.append(scheduler.apply_async(entry))
        clock.advance(0.4)
    clock.advance(300.0)
    sends.append(schedulers[2].apply_async(entry))
    assert [send is not None for send in sends] == [True, False, False, True]
    assert queue_length(app) == 2


def test_a_beat_firing_a_crontab_tick_again_does_not_send_it_again(
    app: Celery, beats: Any, queue_length: Any
) -> None:
    # (A schedule reloaded with its last run reset, say: a second firing of one tick.)
    clock = Clock()
    (scheduler,), entry = beats(
        "jobs.refresh", crontab(minute="*/5", nowfun=clock, app=app), count=1, unique=False
    )
    assert scheduler.apply_async(entry) is not None
    clock.advance(0.4)
    assert scheduler.apply_async(entry) is None
    assert queue_length(app) == 1


def test_a_tick_claim_redis_cannot_answer_sends_unclaimed_under_enqueue(
    make_app: Callable[..., Celery],
    redis_factory: RedisFactory,
    tmp_path: Path,
    queue_length: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    down = redis_factory(start=False)
    app = make_app(dedupe_redis_url=down.url)
    scheduler = DedupeScheduler(app=app, schedule_filename=str(tmp_path / "s"))
    entry = ScheduleEntry(name="e", task="x.y", schedule=60.0, args=(1,), app=app)
    with caplog.at_level(logging.WARNING, logger="dedupe.redis"):
        assert scheduler.apply_async(entry) is not None
    assert queue_length(app) == 1
    assert "x.y[] is sent unclaimed: dedup Redis unavailable" in caplog.text


def test_a_beat_due_again_inside_the_slot_it_claimed_sends_the_next_tick(
    app: Celery, beats: Any, queue_length: Any
) -> None:
    # Celery finds the entry due an interval after its last send; when that lands a hair
    # inside the same slot, the beat's own claim must not cost it the tick.
    clock = Clock()
    clock.at = clock.at.replace(second=0, microsecond=100)
    (first, second), entry = beats(
        "jobs.refresh", schedule(60.0, nowfun=clock, app=app), unique=False
    )
    assert first.apply_async(entry) is not None
    clock.advance(59.9999)
    assert first.apply_async(entry) is not None
    clock.advance(10.0)  # the other beat, in the next slot: that tick is sent already
    assert second.apply_async(entry) is None
    assert queue_length(app) == 2


def test_every_tick_of_a_limited_task_is_sent_with_its_place_in_line(
    app: Celery, tasks: Any, beat: Any, queue_length: Any, redis_client: redis.Redis
) -> None:
    scheduler, entry = beat("jobs.limited_refresh", (4,))
    sent = [scheduler.apply_async(entry) for _ in range(3)]
    assert [result.deduplicated for result in sent] == [False] * 3
    assert len({result.id for result in sent}) == 3
    # On a Redis broker that is the dedup store, the calls over the limit wait in line held
    # in Redis, their messages pushed as slots free; elsewhere each message goes out.
    on_redis = not str(app.conf.broker_url).startswith("amqp")
    assert queue_length(app) == (1 if on_redis else 3)
    assert scheduler.dedupe_skipped["every-minute"] == 0
    _, keys = keys_of_call(tasks.limited_refresh, (4,), None, app, {})
    line = redis_client.zrange(limit_keys(keys.call)["line"], 0, -1)
    assert [task_id.decode() for task_id in line] == [result.id for result in sent]


class UnreachableOnce:
    """An entry argument read from somewhere that fails the first time it is asked (a class
    at module level: the schedule file pickles the entry's arguments)."""

    def __init__(self) -> None:
        self.asked = 0

    def __call__(self) -> int:
        self.asked += 1
        if self.asked == 1:
            raise ConnectionError("the report database is unreachable")
        return 1


@pytest.mark.parametrize("failure", ["the broker unreachable", "the entry's args raise"])
def test_a_tick_whose_send_fails_is_sent_by_the_next_beat(
    app: Celery,
    make_app: Callable[..., Celery],
    beats: Any,
    queue_length: Any,
    tmp_path: Path,
    failure: str,
) -> None:
    # Plain beats side by side would each have sent the tick: the failed send's claim must
    # not leave it sent by nobody.
    clock = Clock()
    every = schedule(60.0, nowfun=clock, app=app)
    args = (BeatLazyFunc(UnreachableOnce()),) if failure == "the entry's args raise" else (1,)
    (failing, second), entry = beats("jobs.refresh", every, args=args, unique=False)
    failing_entry = entry
    if failure == "the broker unreachable":
        dead = make_app(
            broker=UNREACHABLE, dedupe_key_prefix=app.conf.dedupe_key_prefix, **FAILS_AT_ONCE
        )
        failing = DedupeScheduler(app=dead, schedule_filename=str(tmp_path / "dead"))
        failing_entry = ScheduleEntry(
            name=entry.name, task=entry.task, schedule=every, args=args, options=entry.options
        )
    with pytest.raises(SchedulingError, match="Couldn't apply scheduled task shared"):
        failing.apply_async(failing_entry)
    clock.advance(20.0)  # the second beat fires later in the same minute
    assert second.apply_async(entry) is not None
    assert queue_length(app) == 1
    assert second.dedupe_ticks_skipped["shared"] == 0


def test_a_beat_gives_up_only_its_own_tick_claim(store: Store, tag: str) -> None:
    # Its claim expired during a slow send and another beat claimed the tick: that beat may
    # be sending it.
    key = f"{tag}:beat:{{shared}}:1"
    store.claim_tick(key, b"other beat", 60_000)
    assert store.free_tick(key, b"this beat") is False
    assert store.tick_claimant(key) == b"other beat"
    assert store.free_tick(key, b"other beat") is True
    assert store.tick_claimant(key) is None


def test_a_crontab_tick_whose_claim_is_answered_late_is_sent(
    make_app: Callable[..., Celery], redis_factory: RedisFactory, tmp_path: Path, queue_length: Any
) -> None:
    # The claim landed, its answer came after the socket timeout: the client sent it again,
    # and the resend met this beat's own claim.
    proxy = HoldingProxy(redis_factory().port, hold_for=1.0)
    try:
        app = make_app(dedupe_redis_url=proxy.url, dedupe_redis_options={"socket_timeout": 0.5})
        scheduler = DedupeScheduler(app=app, schedule_filename=str(tmp_path / "s"))
        every = crontab(minute="*/5", nowfun=Clock(), app=app)
        entry = ScheduleEntry(
            name="e", task="x.y", schedule=every, args=(1,), options={"unique": False}, app=app
        )
        proxy.hold_at = (f"{app.conf.dedupe_key_prefix}:beat:".encode(),)
        assert scheduler.apply_async(entry) is not None
        assert proxy.held == 1
        assert queue_length(app) == 1
        assert scheduler.dedupe_ticks_skipped["e"] == 0
    finally:
        proxy.close()
