"""key_concurrency and key_rate_limit on one task: runs of a key start at most N per period
and at most M run at once, in call order; every call is accepted and runs. A run takes its
slot and its start together, or neither. Real Redis, real prefork workers; the runs' start
and end times are written by the tasks (RunLog)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

import dedupe
from dedupe.producer.guard import keys_of_call
from dedupe.store.store import Store
from dedupe.values.config import DedupeConfig
from dedupe.values.limits import Rate, limit_keys
from dedupe.values.options import resolve

from .helpers import WorkerProcess
from .test_key_concurrency import most_at_once
from .test_key_rate_limit import _LOG_LAG, most_starts_within

pytestmark = [pytest.mark.slow]

_CONFIG = DedupeConfig(redis_url="")
#: A run's lease, the ttl of its place, and a waiting run's turn (slot_start.lua).
_LEASE_MS, _TTL_MS, _TURN_MS = 60_000, 60_000, 500


@pytest.fixture
def worker(worker_app: Any, tag: str) -> Iterator[str]:
    """A worker of four processes on a queue of the test's own."""
    queue = f"both-{tag}"
    started = WorkerProcess(worker_app.app, {"DEDUPE_TEST_QUEUE": queue}, concurrency=4)
    started.start()
    try:
        yield queue
    finally:
        started.stop()


def test_both_limits_on_one_task_are_both_kept(tag: str) -> None:
    options = resolve(None, "proj.both", _CONFIG, {"key_concurrency": 1, "key_rate_limit": "2/s"})
    assert (options.concurrency, options.rate) == (1, Rate(2, 1.0))


def test_six_calls_all_run_never_two_at_once_never_more_than_two_starts_in_any_second(
    worker_app: Any, tag: str, worker: str
) -> None:
    task = worker_app.one_at_once_two_per_second
    # Short runs: the slot frees long before the second's end, so the rate holds them back
    # as often as the slot does.
    results = [task.apply_async((tag, index, 0.1), queue=worker) for index in range(6)]
    assert [result.deduplicated for result in results] == [False] * 6
    assert [result.get(timeout=60) for result in results] == list(range(6))
    runs = worker_app.runlog(tag).runs()
    assert sorted(run[0] for run in runs) == sorted(result.id for result in results)
    assert most_at_once(runs) == 1
    assert most_starts_within([start for _, start, _ in runs], 1.0 - _LOG_LAG) <= 2


def test_each_call_takes_its_place_in_line_and_a_countdown_to_its_start(
    worker_app: Any, tag: str, redis_client: redis.Redis
) -> None:
    task = worker_app.one_at_once_two_per_second
    queue = f"both-idle-{tag}"  # (no worker: the messages stay as they were published)
    try:
        results = [task.apply_async((tag, index, 0.0), queue=queue) for index in range(6)]
        messages = [json.loads(raw) for raw in reversed(redis_client.lrange(queue, 0, -1))]
    finally:
        redis_client.delete(queue)
    ids = [result.id for result in results]
    assert [message["headers"]["id"] for message in messages] == ids
    # Two per second: the first two start at once, the others wait for their reserved start.
    delayed = [message["headers"]["eta"] is not None for message in messages]
    assert delayed == [False, False, True, True, True, True]
    _, keys = keys_of_call(task, (tag, 0, 0.0), None, worker_app.app, {})
    limited = limit_keys(keys.call)
    assert [member.decode() for member in redis_client.zrange(limited["line"], 0, -1)] == ids
    redis_client.delete(*limited.values())  # (no run will take these places)


# -- the slot and the start together, on a real Redis (no worker) ------------------------------


def _ask(store: Store, keys: dict[str, str], task_id: str) -> tuple[int, int]:
    """A run of ``task_id`` asks, at most one run at once and one start a minute."""
    return store.take_slot_and_start(
        keys, task_id, "t", _LEASE_MS, 1, _TURN_MS, 30_000, _TTL_MS, 1, 60_000
    )


def test_a_run_whose_turn_came_but_not_its_start_keeps_its_place_and_takes_no_slot(
    store: Store, tag: str
) -> None:
    keys = limit_keys(f"test:{{{tag}}}")
    assert _ask(store, keys, "a") == (0, 0)
    assert store.free_slot(keys, "a", "t")
    store.take_ticket(keys, "b", _TTL_MS)
    store.take_ticket(keys, "c", _TTL_MS)
    ahead, wait_ms = _ask(store, keys, "b")
    assert ahead == 0
    assert 59_000 < wait_ms <= 60_001  # (a's start is a minute old then)
    assert store.client.zcard(keys["slots"]) == 0
    assert store.client.zrange(keys["line"], 0, -1) == [b"b", b"c"]  # b still first


def test_a_run_behind_in_line_takes_no_start(store: Store, tag: str) -> None:
    keys = limit_keys(f"test:{{{tag}}}")
    store.take_ticket(keys, "a", _TTL_MS)
    store.take_ticket(keys, "b", _TTL_MS)
    assert _ask(store, keys, "b") == (1, 0)  # (the free slot is a's turn)
    assert store.client.zcard(keys["starts"]) == 0
    assert _ask(store, keys, "a") == (0, 0)
    assert store.client.zcard(keys["starts"]) == 1


def test_a_run_asking_again_after_it_started_is_still_started(store: Store, tag: str) -> None:
    keys = limit_keys(f"test:{{{tag}}}")
    assert _ask(store, keys, "a") == (0, 0)
    assert _ask(store, keys, "a") == (0, 0)  # (a re-sent command: one slot, one start)
    assert store.client.zcard(keys["slots"]) == 1
    assert store.client.zcard(keys["starts"]) == 1


def test_on_rabbitmq_six_calls_all_run_never_two_at_once_never_more_than_two_starts_a_second(
    worker_app: Any, rabbitmq_url: str, tag: str
) -> None:
    # The call takes its start, then its place, then publishes (no one-step push here).
    queue = f"both-amqp-{tag}"
    env = {
        "DEDUPE_TEST_BROKER": rabbitmq_url,
        "DEDUPE_TEST_REDIS": worker_app.REDIS,
        "DEDUPE_TEST_QUEUE": queue,
    }
    producer = Celery(
        "worker_app", broker=rabbitmq_url, backend=worker_app.REDIS, set_as_current=False
    )
    producer.conf.update(
        task_default_queue=queue,
        dedupe_redis_url=worker_app.REDIS,
        dedupe_key_prefix=worker_app.PREFIX,
        broker_transport_options={"confirm_publish": True},
        broker_connection_retry_on_startup=True,
    )
    dedupe.install(producer)

    @producer.task(
        shared=False,
        name=worker_app.one_at_once_two_per_second.name,
        base=dedupe.DedupeTask,
        unique_on=("tag",),
        key_concurrency=1,
        key_rate_limit="2/s",
    )
    def one_at_once_two_per_second(tag: str, index: int, seconds: float) -> int: ...

    worker = WorkerProcess(producer, env, concurrency=4)  # (pinged through RabbitMQ)
    worker.start()
    try:
        results = [one_at_once_two_per_second.delay(tag, index, 0.1) for index in range(6)]
        assert [result.get(timeout=60) for result in results] == list(range(6))
    finally:
        worker.stop()
        with producer.connection_for_write() as connection:
            connection.default_channel.queue_delete(queue)
        producer.close()
    runs = worker_app.runlog(tag).runs()
    assert len(runs) == 6
    assert most_at_once(runs) == 1
    assert most_starts_within([start for _, start, _ in runs], 1.0 - _LOG_LAG) <= 2
