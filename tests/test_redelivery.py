"""A message the broker will redeliver keeps its key: a whole worker SIGKILLed while it runs
an ``acks_late`` task leaves the message with the broker (Redis: unacked until the visibility
timeout; RabbitMQ: back in the queue at once), and the key stays with that task id until the
redelivered message runs; nothing else is let in meanwhile.

Real ``celery worker -P prefork`` processes, killed as a whole process group.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery

import dedupe

from .conftest import in_process_worker
from .helpers import Lines, WorkerProcess, fail_on_keys_left, wait_for

pytestmark = pytest.mark.slow

#: The visibility timeout of the Redis-broker workers here: long enough to see the key held
#: past the dead run's lease, short enough to wait for the redelivery.
VISIBILITY = 8.0


@pytest.fixture(autouse=True)
def no_key_left_behind(redis_client: redis.Redis, worker_app: Any) -> Iterator[None]:
    yield
    fail_on_keys_left(redis_client, worker_app.PREFIX, within=3 * worker_app.LEASE + 3, shared=True)


def running(worker_app: Any, task: Any, tag: str, *args: Any) -> dedupe.Holder:
    """The run of ``task(tag, *args)`` once its body began, not just its claim: the body
    counts its deliveries first, and a kill between the claim and that count would make the
    redelivery run as long as the first delivery (past the test's wait for it)."""
    wait_for(lambda: worker_app.runlog(tag).runs(), message=f"{task.name}({tag!r}) started")
    found: dedupe.Holder = wait_for(
        lambda: (h := dedupe.lookup(task, (tag, *args))) is not None and h.state == "running" and h,
        message=f"{task.name}({tag!r}, ...) running",
    )
    return found


def kill_whole_worker(worker: WorkerProcess) -> None:
    assert worker.process is not None
    os.killpg(worker.process.pid, signal.SIGKILL)
    worker.process.wait()


def test_a_killed_worker_keeps_the_key_of_an_acks_late_message_until_redis_redelivers_it(
    worker_app: Any, tag: str
) -> None:
    queue = f"redelivered-{tag}"
    env = {"DEDUPE_TEST_QUEUE": queue, "DEDUPE_TEST_VISIBILITY": str(VISIBILITY)}
    task = worker_app.redelivered
    first, second = WorkerProcess(worker_app.app, env), WorkerProcess(worker_app.app, env)
    first.start()
    try:
        result = task.apply_async((tag, 30), queue=queue)
        running(worker_app, task, tag, 30)
        kill_whole_worker(first)
        time.sleep(worker_app.LEASE + 1)  # the dead run's lease is over
        # The message is still the broker's (unacked): a call now is its duplicate.
        again = task.apply_async((tag, 30), queue=queue)
        assert again.deduplicated is True
        assert again.id == result.id
        second.start()  # restores the message once the visibility timeout is over
        assert result.get(timeout=VISIBILITY + 20) == tag
        # (The result is stored before the run's end frees the key: a worker stopped in
        # between would leave the message unacked, and its key rightly held.)
        wait_for(lambda: dedupe.lookup(task, (tag, 30)) is None, message="the run freed its key")
    finally:
        first.stop()
        second.stop()
    assert [run[0] for run in worker_app.runlog(tag).runs()] == [result.id, result.id]


@pytest.fixture
def amqp_app(rabbitmq_url: str, worker_app: Any, tag: str) -> Iterator[Celery]:
    """A producer of the worker app's tasks on RabbitMQ, with the same keys."""
    app = Celery("worker_app", broker=rabbitmq_url, backend=worker_app.REDIS, set_as_current=False)
    app.conf.update(
        task_default_queue=f"redelivered-{tag}",
        dedupe_redis_url=worker_app.REDIS,
        dedupe_key_prefix=worker_app.PREFIX,
        dedupe_default_lease=worker_app.LEASE,
        broker_transport_options={"confirm_publish": True},
        broker_connection_retry_on_startup=True,
    )
    dedupe.install(app)
    yield app
    try:
        with app.connection_for_write() as connection:
            connection.default_channel.queue_delete(app.conf.task_default_queue)
    finally:
        app.close()


def test_a_killed_worker_keeps_the_key_of_an_acks_late_message_rabbitmq_gives_back(
    worker_app: Any, amqp_app: Celery, rabbitmq_url: str, tag: str
) -> None:
    @amqp_app.task(
        name=worker_app.redelivered.name,
        bind=True,
        base=dedupe.DedupeTask,
        unique=True,
        acks_late=True,
        shared=False,
    )
    def redelivered(self: Any, tag: str, seconds: float) -> str: ...

    env = {
        "DEDUPE_TEST_BROKER": rabbitmq_url,
        "DEDUPE_TEST_QUEUE": amqp_app.conf.task_default_queue,
    }
    first, second = WorkerProcess(amqp_app, env), WorkerProcess(amqp_app, env)
    first.start()
    try:
        result = redelivered.delay(tag, 30)
        running(worker_app, redelivered, tag, 30)
        kill_whole_worker(first)
        time.sleep(worker_app.LEASE + 1)  # the dead run's lease is over
        # RabbitMQ has the message back in the queue: a call now is its duplicate.
        again = redelivered.delay(tag, 30)
        assert again.deduplicated is True
        assert again.id == result.id
        second.start()
        assert result.get(timeout=20) == tag
        wait_for(lambda: dedupe.lookup(redelivered, (tag, 30)) is None, message="key freed")
    finally:
        first.stop()
        second.stop()
    assert [run[0] for run in worker_app.runlog(tag).runs()] == [result.id, result.id]


def test_a_worker_on_the_redis_broker_warns_at_start_how_long_a_dead_runs_key_waits(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app(broker_transport_options={"visibility_timeout": 600})

    @app.task(base=dedupe.DedupeTask, unique=True, acks_late=True, unique_lease=10, shared=False)
    def report(day: str) -> None: ...

    with Lines("dedupe.worker", logging.WARNING) as log, in_process_worker(app):
        pass
    (warning,) = [message for message in log.lines if "visibility_timeout" in message]
    assert report.name in warning
    assert "700 s" in warning  # the timeout and kombu's restore sweep (10 x 10 s)


def test_a_worker_on_rabbitmq_gives_no_visibility_warning(
    make_app: Callable[..., Celery], rabbitmq_url: str
) -> None:
    app = make_app(broker=rabbitmq_url)

    @app.task(base=dedupe.DedupeTask, unique=True, acks_late=True, shared=False)
    def nightly(day: str) -> None: ...

    with Lines("dedupe.worker", logging.WARNING) as log, in_process_worker(app):
        pass
    assert not [message for message in log.lines if "visibility_timeout" in message]


def record_ttl_while_running(app: Celery, task: Any, key: Callable[[Any], str]) -> int:
    """The ttl, in ms, of a run's record while it runs (an in-process worker)."""
    client = redis.Redis.from_url(app.conf.dedupe_redis_url)
    try:
        with in_process_worker(app):
            result = task.delay(1)
            name = key(result)
            wait_for(lambda: (h := dedupe.lookup(task, (1,))) is not None and h.state == "running")
            ttl = int(client.pttl(name))
            # The result is stored before the key is freed: not ready, the ttl read was the run's.
            assert not result.ready()
            result.get(timeout=10)
        return ttl
    finally:
        client.close()


def test_an_acks_late_runs_record_outlives_its_lease_on_rabbitmq_for_unique_ttl(
    make_app: Callable[..., Celery], rabbitmq_url: str
) -> None:
    app = make_app(broker=rabbitmq_url)

    @app.task(base=dedupe.DedupeTask, unique=True, acks_late=True, unique_lease=5, shared=False)
    def slow(x: int) -> None:
        time.sleep(3)

    ttl = record_ttl_while_running(app, slow, lambda result: result.keys.run)
    assert 5_000 < ttl <= 3_600_000


def test_a_started_mode_run_lock_lives_for_its_lease_even_under_acks_late(
    make_app: Callable[..., Celery],
) -> None:
    # The run lock of unique_until="started" is a mutex alone: a redelivery need not hold it.
    app = make_app()

    @app.task(
        base=dedupe.DedupeTask,
        unique=True,
        unique_until="started",
        acks_late=True,
        unique_lease=5,
        shared=False,
    )
    def slow_started(x: int) -> None:
        time.sleep(3)

    ttl = record_ttl_while_running(app, slow_started, lambda result: result.keys.run)
    assert 0 < ttl <= 5_000
