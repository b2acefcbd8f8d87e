"""A publish whose connection dies under its first try (kombu declares the queue's exchange
on a connection's first publish, and tries that again on a new connection) is still decided
at its push: a duplicate is refused, and no second message goes out. A publish whose
publisher confirm never comes back keeps its record (its message may be queued); one the
broker refuses (a Nack) frees its key. In-process, RabbitMQ, behind a proxy that cuts the
connection where the test says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from amqp.exceptions import MessageNacked
from celery import Celery
from kombu.exceptions import OperationalError

import dedupe
from dedupe.producer.guard import keys_of_call
from dedupe.values.defaults import PROVISIONAL_TTL

from .helpers import BASIC_PUBLISH, CONFIRMED_ONCE, full_queue
from .proxies import RABBITMQ_PORT, CuttingProxy


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
            broker=proxy.amqp_url,
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


def test_an_accepted_call_whose_publish_is_retried_on_a_new_connection_keeps_its_record(
    make_app: Callable[..., Celery], rabbitmq_url: str, queue_length: Callable[[Celery], int]
) -> None:
    proxy = CuttingProxy(RABBITMQ_PORT)
    try:
        app = make_app(broker=proxy.amqp_url)
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


def test_an_accepted_call_whose_confirm_never_comes_back_leaves_its_record_provisional(
    make_app: Callable[..., Celery],
    rabbitmq_url: str,
    queue_length: Callable[[Celery], int],
    redis_client: redis.Redis,
) -> None:
    # RabbitMQ gets the message and the connection dies before its publisher confirm comes
    # back: the call raises, and its message may be queued (here it is) or lost. Its key
    # says so for the provisional ttl, as a publish that hangs leaves it: not for unique_ttl.
    proxy = CuttingProxy(RABBITMQ_PORT, delivered=True)
    try:
        app = make_app(broker=proxy.amqp_url, **CONFIRMED_ONCE)
        job = _job(app)
        proxy.cut_at = (BASIC_PUBLISH, app.conf.task_default_queue.encode())
        with pytest.raises(Exception, match=r"(?i)connection|socket|closed|eof"):
            job.delay(1)
        assert proxy.cuts == 1
        assert queue_length(app) == 1
        _, keys = keys_of_call(job, (1,), None, app, {})
        assert 0 < redis_client.pttl(keys.call) <= PROVISIONAL_TTL * 1000
        assert job.delay(1).deduplicated is True
        assert queue_length(app) == 1
    finally:
        proxy.close()


def test_an_accepted_call_whose_confirm_kombu_publishes_again_is_confirmed(
    make_app: Callable[..., Celery], rabbitmq_url: str, redis_client: redis.Redis
) -> None:
    # The confirm never comes back, and kombu's retry publishes the message again on a new
    # connection: the call returns accepted, and its record is made durable as any other's.
    proxy = CuttingProxy(RABBITMQ_PORT, delivered=True)
    try:
        app = make_app(broker=proxy.amqp_url)
        job = _job(app)
        proxy.cut_at = (BASIC_PUBLISH, app.conf.task_default_queue.encode())
        assert job.delay(1).deduplicated is False
        assert proxy.cuts == 1
        _, keys = keys_of_call(job, (1,), None, app, {})
        assert redis_client.pttl(keys.call) > PROVISIONAL_TTL * 1000
    finally:
        proxy.close()


def test_an_accepted_call_the_broker_refuses_under_publisher_confirms_frees_its_key(
    make_app: Callable[..., Celery],
    rabbitmq_url: str,
    queue_length: Callable[[Celery], int],
    redis_client: redis.Redis,
) -> None:
    # A full queue that rejects publishes: the broker answers the message with a Nack.
    app = make_app(**full_queue(rabbitmq_url))
    job = _job(app)
    assert job.delay(1).deduplicated is False
    with pytest.raises(OperationalError) as refused:  # (kombu's, raised from the Nack)
        job.delay(2)
    assert isinstance(refused.value.__cause__ or refused.value.__context__, MessageNacked)
    assert queue_length(app) == 1
    _, keys = keys_of_call(job, (2,), None, app, {})
    assert redis_client.exists(keys.call) == 0
