"""Concurrent producers: many processes making the same call at once publish it once."""

from __future__ import annotations

import multiprocessing
import uuid
from typing import Any

import redis

from dedupe._redis_server import RedisServer

PROCESSES = 8
CALLS = 200


def _produce(tag: str, queue: str, barrier: Any, results: Any) -> None:
    from tests import worker_app

    worker_app.ok.app.connection_for_write().ensure_connection()
    worker_app.dedupe.lookup(worker_app.ok, (tag,))  # connect to Redis before the start line
    barrier.wait()
    ids = {worker_app.ok.apply_async((tag,), queue=queue).id for _ in range(CALLS)}
    results.put(sorted(ids))


def test_eight_processes_making_the_same_call_publish_exactly_one_message(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    tag, queue = f"race-{uuid.uuid4().hex}", f"race-{uuid.uuid4().hex}"
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    processes = [
        context.Process(target=_produce, args=(tag, queue, barrier, results))
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    seen = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0

    messages = redis_client.lrange(queue, 0, -1)
    assert len(messages) == 1
    (published_id,) = {ids[0] for ids in seen}
    assert all(ids == [published_id] for ids in seen)
    assert published_id.encode() in messages[0]
    redis_client.delete(queue, *redis_client.keys("wk:{tests.worker_app.ok:*"))
