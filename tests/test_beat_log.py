"""What a beat's log says of each tick: "Sending due task" only for a tick that is sent, the
library's "not sending" line alone for one skipped, driven through the schedulers' own loops
(Celery's ``Scheduler.tick``, RedBeat's ``maybe_due``) in this process."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.schedules import schedule

from dedupe.beat import DedupeScheduler

ENTRY = "every-minute"


class Clock:
    """The clock of the entry's schedule, moved by the test. Its time is the class's: the
    default scheduler keeps its entries pickled (its schedule file), each read a copy."""

    at = dt.datetime(2026, 11, 24, 9, 0, 0, 500_000, tzinfo=dt.timezone.utc)

    def __call__(self) -> dt.datetime:
        return Clock.at

    def advance(self, seconds: float) -> None:
        Clock.at += dt.timedelta(seconds=seconds)


class Lines(logging.Handler):
    """The lines of the beat loggers (Celery's, RedBeat's and dedupe's), in their order."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def about(self, name: str) -> list[str]:
        return [line for line in self.lines if name in line]


@pytest.fixture
def lines() -> Iterator[Lines]:
    # A handler on the loggers themselves: a worker started earlier in the session may have
    # stopped Celery's loggers from propagating to caplog's.
    handler = Lines()
    loggers = [logging.getLogger(name) for name in ("celery.beat", "dedupe.beat")]
    levels = [each.level for each in loggers]
    for each in loggers:
        each.addHandler(handler)
        each.setLevel(logging.INFO)
    yield handler
    for each, level in zip(loggers, levels, strict=True):
        each.removeHandler(handler)
        each.setLevel(level)


@pytest.fixture
def clock() -> Iterator[Clock]:
    start = Clock.at
    yield Clock()
    Clock.at = start


@pytest.fixture
def scheduler(redis_app: Celery, tmp_path: Path, clock: Clock) -> Iterator[DedupeScheduler]:
    """Celery's default scheduler, deduplicating, with one entry due every minute of
    ``clock`` (its task is never consumed: a sent run stays queued)."""
    redis_app.conf.beat_schedule = {
        ENTRY: {
            "task": "jobs.refresh",
            "schedule": schedule(60.0, nowfun=clock, app=redis_app),
            "args": (1,),
        }
    }
    beat = DedupeScheduler(app=redis_app, schedule_filename=str(tmp_path / "schedule"))
    yield beat
    beat.close()


def tick(beat: Any, clock: Clock) -> None:
    """Let a minute pass, then run the scheduler's loop until it has handled the entry."""
    clock.advance(60.0)
    while beat.tick() == 0:
        pass


def test_a_sent_tick_logs_sending_due_task_once(
    scheduler: DedupeScheduler, clock: Clock, lines: Lines
) -> None:
    tick(scheduler, clock)
    assert lines.about(ENTRY) == [f"Scheduler: Sending due task {ENTRY} (jobs.refresh)"]


def test_a_tick_skipped_while_its_run_is_queued_logs_only_not_sending(
    scheduler: DedupeScheduler, clock: Clock, lines: Lines
) -> None:
    tick(scheduler, clock)
    sent = len(lines.lines)
    tick(scheduler, clock)
    (said,) = [line for line in lines.lines[sent:] if ENTRY in line]
    assert said.startswith(f"beat: not sending {ENTRY} (jobs.refresh): its previous run ")
    assert said.endswith("is still queued (skipped 1 time)")


def test_the_skip_count_says_times_from_the_second_skip(
    scheduler: DedupeScheduler, clock: Clock, lines: Lines
) -> None:
    for _ in range(3):
        tick(scheduler, clock)
    skips = [line[line.rindex("(") :] for line in lines.about("not sending")]
    assert skips == ["(skipped 1 time)", "(skipped 2 times)"]


def test_a_tick_another_beat_sent_logs_only_not_sending(
    redis_app: Celery, tmp_path: Path, clock: Clock, lines: Lines
) -> None:
    redis_app.conf.beat_schedule = {
        ENTRY: {"task": "jobs.refresh", "schedule": schedule(60.0, nowfun=clock, app=redis_app)}
    }
    first, second = (
        DedupeScheduler(app=redis_app, schedule_filename=str(tmp_path / f"schedule-{n}"))
        for n in range(2)
    )
    try:
        clock.advance(60.0)
        first.tick()
        sent = len(lines.lines)
        clock.advance(20.0)  # the second beat fires later in the same minute
        second.tick()
    finally:
        first.close()
        second.close()
    assert lines.about(ENTRY)[:sent] == [f"Scheduler: Sending due task {ENTRY} (jobs.refresh)"]
    assert lines.lines[sent:] == [
        f"beat: not sending {ENTRY} (jobs.refresh): another beat sent this tick (skipped 1 time)"
    ]


def test_redbeat_logs_sending_due_task_only_for_a_tick_sent(
    redis_app: Celery, clock: Clock, lines: Lines, tag: str
) -> None:
    pytest.importorskip("redbeat", reason="celery-redbeat is not installed")
    from redbeat import RedBeatSchedulerEntry

    from dedupe.beat.redbeat import DedupeRedBeatScheduler

    redis_app.conf.redbeat_redis_url = redis_app.conf.dedupe_redis_url
    redis_app.conf.redbeat_key_prefix = f"redbeat-{tag}"
    beat = DedupeRedBeatScheduler(app=redis_app, lock_key=None)
    entry = RedBeatSchedulerEntry(
        ENTRY, "jobs.refresh", schedule(60.0, nowfun=clock, app=redis_app), app=redis_app
    )
    try:
        entry.save()
        clock.advance(60.0)
        beat.maybe_due(entry, producer=beat.producer)
        beat.maybe_due(entry, producer=beat.producer)  # (this copy of it is due still)
    finally:
        entry.delete()
        beat.close()
    said = lines.about(ENTRY)
    assert said[0] == f"Scheduler: Sending due task {ENTRY} (jobs.refresh)"
    assert len(said) == 2
    assert said[1].startswith(f"beat: not sending {ENTRY} (jobs.refresh): ")
    assert said[1].endswith("(skipped 1 time)")
