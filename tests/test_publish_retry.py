"""A publish whose connection dies under its first try (kombu declares the queue's exchange
on a connection's first publish, and tries that again on a new connection) is still decided
at its push: a duplicate is refused, and no second message goes out. In-process, RabbitMQ
behind a proxy that cuts the connection as it declares the exchange."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery

import dedupe

from .proxies import CuttingProxy

RABBITMQ_PORT = 5672


def _job(app: Celery) -> Any:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="retried.job")
    def job(x: int) -> int:
        return x

    return job


def test_a_duplicate_whose_publish_is_retried_on_a_new_connection_is_refused(
    make_app: Callable[..., Celery], rabbitmq_url: str, queue_length: Callable[[Celery], int]
) -> None:
    first = make_app(broker=rabbitmq_url)
    assert _job(first).delay(1).deduplicated is False
    proxy = CuttingProxy(RABBITMQ_PORT)
    try:
        # Another process's app (its own connection, through the proxy), the same keys and queue.
        app = make_app(
            broker=f"amqp://guest:guest@127.0.0.1:{proxy.port}//",
            dedupe_key_prefix=first.conf.dedupe_key_prefix,
            task_default_queue=first.conf.task_default_queue,
        )
        proxy.cut_at = (first.conf.task_default_queue.encode(),)
        again = _job(app).delay(1)
        assert proxy.cuts == 1  # (the first try died; kombu declared again on a new one)
        assert again.deduplicated is True
        assert queue_length(first) == 1
    finally:
        proxy.close()


#: The start of an AMQP Basic.Publish method frame's payload (class 60, method 40).
BASIC_PUBLISH = b"\x00<\x00("


def test_an_accepted_call_whose_publish_is_retried_on_a_new_connection_keeps_its_record(
    make_app: Callable[..., Celery], rabbitmq_url: str, queue_length: Callable[[Celery], int]
) -> None:
    proxy = CuttingProxy(RABBITMQ_PORT)
    try:
        app = make_app(broker=f"amqp://guest:guest@127.0.0.1:{proxy.port}//")
        job = _job(app)
        # The message's own frame is cut: the transport's publish raises, kombu publishes
        # again on a new connection, past the channel the push seam shadowed.
        proxy.cut_at = (BASIC_PUBLISH, app.conf.task_default_queue.encode())
        accepted = job.delay(1)
        assert proxy.cuts == 1
        assert accepted.deduplicated is False
        assert queue_length(app) == 1
        assert job.delay(1).deduplicated is True
        assert queue_length(app) == 1
    finally:
        proxy.close()
