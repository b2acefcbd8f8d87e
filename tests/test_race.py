"""Concurrent producers: many processes making the same call at once publish it once.

With a Redis broker and with RabbitMQ: the dedup records live in Redis either way.
"""

from __future__ import annotations

import json
import multiprocessing
import uuid
from typing import Any

import pytest
import redis
from kombu import Connection

from dedupe.demo.server import RedisServer

pytestmark = pytest.mark.slow  # eight spawned producer processes

PROCESSES = 8
CALLS = 200


def _produce(tag: str, queue: str, broker: str | None, barrier: Any, results: Any) -> None:
    from tests import worker_app

    if broker is not None:
        # Publisher confirms: once a call returns, RabbitMQ has its message.
        worker_app.app.conf.update(
            broker_url=broker, broker_transport_options={"confirm_publish": True}
        )
    worker_app.ok.app.connection_for_write().ensure_connection()
    worker_app.dedupe.lookup(worker_app.ok, (tag,))  # connect to Redis before the start line
    barrier.wait()
    ids = {worker_app.ok.apply_async((tag,), queue=queue).id for _ in range(CALLS)}
    results.put(sorted(ids))


def _rabbitmq_messages(url: str, queue: str) -> list[dict[str, Any]]:
    """Every message waiting in ``queue`` (their headers), then the queue is deleted."""
    with Connection(url) as connection:
        channel = connection.default_channel
        _, count, _ = channel.queue_declare(queue, passive=True)
        headers = []
        for _ in range(count):
            message = channel.basic_get(queue, no_ack=True)
            headers.append(dict(message.headers))
        channel.queue_delete(queue)
        return headers


@pytest.mark.parametrize("broker_kind", ["redis", "amqp"])
def test_eight_processes_making_the_same_call_publish_exactly_one_message(
    broker_kind: str,
    request: pytest.FixtureRequest,
    redis_server: RedisServer,
    redis_client: redis.Redis,
) -> None:
    broker = request.getfixturevalue("rabbitmq_url") if broker_kind == "amqp" else None
    tag, queue = f"race-{uuid.uuid4().hex}", f"race-{uuid.uuid4().hex}"
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    processes = [
        context.Process(target=_produce, args=(tag, queue, broker, barrier, results))
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    seen = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0

    if broker is None:
        messages = [json.loads(raw)["headers"] for raw in redis_client.lrange(queue, 0, -1)]
        redis_client.delete(queue)
    else:
        messages = _rabbitmq_messages(broker, queue)
    assert len(messages) == 1
    (published_id,) = {ids[0] for ids in seen}
    assert all(ids == [published_id] for ids in seen)
    assert messages[0]["id"] == published_id
    redis_client.delete(*redis_client.keys("wk:{tests.worker_app.ok:*"))
