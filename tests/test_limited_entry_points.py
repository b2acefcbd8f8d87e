"""key_concurrency and key_rate_limit through dedupe.apply_async, apply_many, aapply_many and
aapply_async: every call is accepted and takes its place in line (or reserves its start), as
through delay. Real Redis, real prefork workers; the runs' start and end times are written by
the tasks."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.exceptions import OperationalError

import dedupe
from dedupe.producer.guard import keys_of_call
from dedupe.values.limits import limit_keys

from .helpers import FAILS_AT_ONCE, UNREACHABLE, WorkerProcess, keys_with_prefix
from .test_key_concurrency import most_at_once

pytestmark = [pytest.mark.slow]


@pytest.fixture
def queue(worker_app: Any, tag: str) -> Iterator[str]:
    """A queue of the test's own, served by one worker of four processes."""
    name = f"limits-entry-{tag}"
    worker = WorkerProcess(worker_app.app, {"DEDUPE_TEST_QUEUE": name}, concurrency=4)
    worker.start()
    try:
        yield name
    finally:
        worker.stop()


def test_six_limited_calls_through_apply_many_all_run_never_more_than_two_at_once(
    worker_app: Any, tag: str, queue: str
) -> None:
    results = dedupe.apply_many(
        worker_app.two_at_once, [((tag, index, 1.0), {}) for index in range(6)], queue=queue
    )
    assert [result.deduplicated for result in results] == [False] * 6
    assert len({result.id for result in results}) == 6
    assert [result.get(timeout=30) for result in results] == list(range(6))
    assert most_at_once(worker_app.runlog(tag).runs()) == 2


def test_six_limited_calls_through_aapply_async_all_run_never_more_than_two_at_once(
    worker_app: Any, tag: str, queue: str
) -> None:
    async def calls() -> list[dedupe.DedupeResult]:
        task = worker_app.two_at_once
        return [
            await dedupe.aapply_async(task, args=(tag, index, 1.0), queue=queue)
            for index in range(6)
        ]

    results = asyncio.run(calls())
    assert [result.deduplicated for result in results] == [False] * 6
    assert [result.get(timeout=30) for result in results] == list(range(6))
    assert most_at_once(worker_app.runlog(tag).runs()) == 2


def test_six_limited_calls_through_dedupe_apply_async_all_run_never_more_than_two_at_once(
    worker_app: Any, tag: str, queue: str
) -> None:
    # The producer guard a web view imports takes a limited task's calls as its delay does.
    task = worker_app.two_at_once
    results = [dedupe.apply_async(task, args=(tag, index, 1.0), queue=queue) for index in range(6)]
    assert [result.deduplicated for result in results] == [False] * 6
    assert [result.get(timeout=30) for result in results] == list(range(6))
    assert most_at_once(worker_app.runlog(tag).runs()) == 2


def test_rate_limited_calls_through_aapply_many_are_published_with_a_countdown_to_their_start(
    worker_app: Any, tag: str, redis_client: redis.Redis
) -> None:
    queue = f"rate-entry-idle-{tag}"  # (no worker: the messages stay as they were published)
    sent_at = time.time()
    try:
        results = asyncio.run(
            dedupe.aapply_many(
                worker_app.two_per_second, [((tag, index), {}) for index in range(4)], queue=queue
            )
        )
        messages = [json.loads(raw) for raw in reversed(redis_client.lrange(queue, 0, -1))]
    finally:
        redis_client.delete(queue)
    assert [message["headers"]["id"] for message in messages] == [r.id for r in results]
    delays = [_seconds_to(message["headers"]["eta"], sent_at) for message in messages]
    assert delays[:2] == [0.0, 0.0]
    assert all(0.9 <= delay <= 1.5 for delay in delays[2:]), delays


def _seconds_to(eta: str | None, since: float) -> float:
    if eta is None:
        return 0.0
    return datetime.fromisoformat(eta).timestamp() - since


def test_a_limited_batch_call_whose_publish_fails_leaves_no_place_in_line(
    make_app: Callable[..., Celery], redis_client: redis.Redis
) -> None:
    app = make_app(broker=UNREACHABLE, **FAILS_AT_ONCE)

    @app.task(shared=False, base=dedupe.DedupeTask, key_concurrency=1, unique_on=("x",))
    def job(x: int) -> None: ...

    with pytest.raises(OperationalError):
        dedupe.apply_many(job, [((1,), {}), ((1,), {})])
    _, keys = keys_of_call(job, (1,), None, app, {})
    assert redis_client.zcard(limit_keys(keys.call)["line"]) == 0
    assert keys_with_prefix(redis_client, app.conf.dedupe_key_prefix) == []


def test_a_unique_batch_of_a_limited_task_is_refused_naming_what_to_call(
    worker_app: Any, tag: str
) -> None:
    with pytest.raises(dedupe.ConfigurationError, match=r"never deduplicated.*dedupe\.apply_many"):
        worker_app.two_at_once.map_unique([(tag, 0, 0.0)])
