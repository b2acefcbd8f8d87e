"""Real ``celery beat`` processes with the deduplicating schedulers, and a real worker.

An entry fires every second; its task runs for 3.5 s on a worker with two processes. Without
dedup, runs would overlap and the queue would pile up; with it, the entry is sent again only
after the previous run ends.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import dedupe
from dedupe.values.header import KeyHeader

from .conftest import RedisFactory
from .helpers import ROOT, BeatProcess, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefork_worker")]

SECONDS = 3.5
OBSERVE = 12.0


def queued_per_key(client: redis.Redis, queue: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for raw in client.lrange(queue, 0, -1):
        header = KeyHeader.read(json.loads(raw)["headers"])
        if header:
            counts[header.keys.call] = counts.get(header.keys.call, 0) + 1
    return counts


def observe(
    client: redis.Redis, queue: str, seconds: float, key_pattern: str
) -> tuple[int, set[str]]:
    """The most messages of one key seen waiting in the queue at once, and the dedup keys
    matching ``key_pattern`` seen live (queued or running) meanwhile."""
    most = 0
    seen: set[str] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        most = max([most, *queued_per_key(client, queue).values()])
        seen.update(key.decode() for key in client.scan_iter(match=key_pattern, count=1000))
        time.sleep(0.05)
    return most, seen


@pytest.fixture
def run_beats(
    tmp_path: Path, worker_app: Any, redis_client: redis.Redis, tag: str
) -> Iterator[Any]:
    """Run beat processes for OBSERVE seconds; return (most queued per key, beats, keys)."""
    started: list[BeatProcess] = []

    def run(scheduler: str, count: int = 1, **env: str) -> tuple[int, list[BeatProcess], set[str]]:
        beats = [
            BeatProcess(scheduler, {"DEDUPE_BEAT_TAG": tag, **env}, tmp_path) for _ in range(count)
        ]
        started.extend(beats)
        for beat in beats:
            beat.start()
        pattern = f"{worker_app.app.conf.dedupe_key_prefix}:{{{worker_app.plain_sleepy.name}:*"
        most, keys = observe(redis_client, worker_app.QUEUE, OBSERVE, pattern)
        for beat in beats:
            beat.stop()
        # Let the last run end and free its key (the keys seen: entries sent by name are
        # keyed on their arguments as passed, so lookup() would not find them).
        assert keys, "no dedup key of the entry was ever seen"
        wait_for(
            lambda: redis_client.exists(*keys) == 0,
            timeout=SECONDS + 10,
            message="last run's key freed",
        )
        return most, beats, keys

    yield run
    for beat in started:
        beat.stop()


def assert_runs_back_to_back(worker_app: Any, tag: str) -> None:
    runs = worker_app.runlog(tag).runs()
    assert len(runs) >= 2, runs
    assert worker_app.runlog(tag).overlaps() == []
    for previous, following in itertools.pairwise(runs):
        assert previous[2] is not None
        assert following[1] - previous[2] < 2.5, "a run started late: something was stuck"


def test_one_beat_never_piles_up_or_overlaps_a_slow_task(
    run_beats: Any, worker_app: Any, tag: str
) -> None:
    most_queued, (beat,), _ = run_beats("dedupe.beat:DedupeScheduler")
    assert most_queued <= 1
    assert_runs_back_to_back(worker_app, tag)
    assert "not sending sleepy-every-second (tests.worker_app.plain_sleepy)" in beat.tail()


def test_two_beats_side_by_side_do_not_double_the_work(
    run_beats: Any, worker_app: Any, tag: str
) -> None:
    most_queued, beats, _ = run_beats("dedupe.beat:DedupeScheduler", count=2)
    assert most_queued <= 1
    assert_runs_back_to_back(worker_app, tag)
    # Each beat fired the entry: it sent a tick, or said why not.
    assert all(
        "Sending due task sleepy-every-second" in beat.tail()
        or "not sending sleepy-every-second" in beat.tail()
        for beat in beats
    )


TICKS = 15  # an entry firing every second, watched this many seconds


@pytest.mark.parametrize("count", [2, 3])
def test_beats_side_by_side_send_each_tick_of_a_short_task_once(
    tmp_path: Path, worker_app: Any, tag: str, count: int
) -> None:
    # A 0.1 s task frees its key long before the next tick: only the tick claim keeps
    # beats at different phases from each sending every tick.
    env = {"DEDUPE_BEAT_TAG": tag, "DEDUPE_BEAT_TASK_SECONDS": "0.1"}
    beats = [BeatProcess("dedupe.beat:DedupeScheduler", env, tmp_path) for _ in range(count)]
    try:
        for beat in beats:
            beat.start()
        began = time.time()
        time.sleep(TICKS)
        ended = time.time()
    finally:
        for beat in beats:
            beat.stop()
    wait_for(
        lambda: all(run[2] is not None for run in worker_app.runlog(tag).runs()),
        timeout=10,
        message="the last run ended",
    )
    runs = [run for run in worker_app.runlog(tag).runs() if began <= run[1] <= ended + 0.5]
    ticks = ended - began
    assert ticks - 1 <= len(runs) <= ticks + 1, (len(runs), ticks)
    skipped = sum(beat.tail().count("another beat sent this tick") for beat in beats)
    assert skipped >= (count - 1) * (TICKS - 2)


def test_an_entry_whose_task_beat_does_not_import_is_deduplicated(
    run_beats: Any, worker_app: Any, tag: str
) -> None:
    most_queued, (beat,), _ = run_beats("dedupe.beat:DedupeScheduler", DEDUPE_BEAT_MODE="names")
    assert most_queued <= 1
    assert_runs_back_to_back(worker_app, tag)
    assert "not sending sleepy-every-second" in beat.tail()


def test_the_mixin_composes_with_django_celery_beats_database_scheduler(
    run_beats: Any, worker_app: Any, tag: str, tmp_path: Path, redis_client: redis.Redis
) -> None:
    pytest.importorskip("django_celery_beat", reason="django-celery-beat is not installed")
    env = {
        "DEDUPE_BEAT_MODE": "django",
        "DEDUPE_BEAT_DB": str(tmp_path / "beat.sqlite3"),
        "DEDUPE_BEAT_TAG": tag,
    }
    subprocess.run(
        [sys.executable, "-c", "import tests.beat_app as b; b.seed_database()"],
        cwd=ROOT,
        env={**__import__("os").environ, **env, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    most_queued, (beat,), keys = run_beats("dedupe.beat.database:DedupeDatabaseScheduler", **env)
    # The PeriodicTask's "dedupe" header set unique_on=("tag",): the key ignores `seconds`.
    by_tag = dedupe.apply_async(
        worker_app.plain_sleepy, args=(tag, SECONDS + 1), unique_on=("tag",), queue=f"none-{tag}"
    )
    dedupe.clear(worker_app.plain_sleepy, args=(tag, 0), unique_on=("tag",))
    redis_client.delete(f"none-{tag}")
    assert keys == {by_tag.keys.call}
    assert most_queued <= 1
    assert_runs_back_to_back(worker_app, tag)
    assert "not sending sleepy-every-second" in beat.tail()


def test_the_mixin_composes_with_redbeat(run_beats: Any, worker_app: Any, tag: str) -> None:
    pytest.importorskip("redbeat", reason="celery-redbeat is not installed")
    most_queued, (beat,), _ = run_beats("dedupe.beat.redbeat:DedupeRedBeatScheduler")
    assert most_queued <= 1
    assert_runs_back_to_back(worker_app, tag)
    assert "not sending sleepy-every-second" in beat.tail()


def test_beat_keeps_running_while_the_dedup_redis_is_down(
    tmp_path: Path, redis_factory: RedisFactory, redis_client: redis.Redis, tag: str
) -> None:
    dedup = redis_factory()
    queue = f"beat-outage-{tag}"  # nothing consumes it: records stay queued, sends are skipped
    beat = BeatProcess(
        "dedupe.beat:DedupeScheduler",
        {"DEDUPE_BEAT_TAG": tag, "DEDUPE_BEAT_DEDUP_REDIS": dedup.url, "DEDUPE_BEAT_QUEUE": queue},
        tmp_path,
    )
    try:
        beat.start()
        wait_for(lambda: "not sending" in beat.tail(), timeout=10, message="a skipped send")
        dedup.stop()
        wait_for(
            lambda: beat.tail().count("without dedup") >= 2,
            timeout=10,
            message="sends without dedup while Redis is down",
        )
        assert beat.alive()
        dedup.start()
        # A send begun before the restart may publish (without dedup) a moment after it: the
        # beat sends one entry at a time, so a tick begun since marks the end of that one.
        restarted = len(beat.tail())
        wait_for(
            lambda: "Sending due task" in beat.tail()[restarted:],
            timeout=10,
            message="a tick begun after the restart",
        )
        sent_while_down = redis_client.llen(queue)
        marker = len(beat.tail())
        wait_for(
            lambda: "not sending" in beat.tail()[marker:],
            timeout=10,
            message="dedup again once Redis is back",
        )
        assert beat.alive()
        assert sent_while_down >= 2
        assert redis_client.llen(queue) <= sent_while_down + 1
    finally:
        beat.stop()
        redis_client.delete(queue)
