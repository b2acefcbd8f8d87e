"""A message Celery requeues after its child was killed (``acks_late`` with
``reject_on_worker_lost``) runs again at once: Celery sends no end signal for it, and its
redelivered copy's claim finds the key held by its own dead run, which it takes over instead
of waiting out that run's lease.

Real ``celery worker -P prefork`` processes, on the Redis broker and on RabbitMQ; the task's
lease is 30 s, so a redelivery that waited for it would start far too late.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from celery import Celery

import dedupe

from .helpers import WorkerProcess, fail_on_keys_left, wait_for

pytestmark = pytest.mark.slow

#: How soon after the kill the redelivered message must start: Celery noticing the lost
#: child (seconds on a loaded machine), its requeue, the delivery and the claim; far under
#: the 30 s lease.
STARTS_WITHIN = 10.0


@dataclass
class Requeuing:
    """A worker of tests.worker_app on one broker, and a producer of its task there."""

    app: Celery
    task: Any
    worker: WorkerProcess


@pytest.fixture(autouse=True)
def no_key_left_behind(redis_client: redis.Redis, worker_app: Any) -> Iterator[None]:
    yield
    fail_on_keys_left(redis_client, worker_app.PREFIX, within=3 * worker_app.LEASE + 3, shared=True)


@pytest.fixture(params=["redis", "amqp"])
def requeuing(request: pytest.FixtureRequest, worker_app: Any, tag: str) -> Iterator[Requeuing]:
    queue = f"requeued-{tag}"
    env = {"DEDUPE_TEST_QUEUE": queue}
    broker = worker_app.BROKER
    if request.param == "amqp":
        broker = request.getfixturevalue("rabbitmq_url")
        env["DEDUPE_TEST_BROKER"] = broker
    app = Celery("worker_app", broker=broker, backend=worker_app.REDIS, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        dedupe_redis_url=worker_app.REDIS,
        dedupe_key_prefix=worker_app.PREFIX,
        dedupe_default_lease=worker_app.LEASE,
        broker_connection_retry_on_startup=True,
    )
    if request.param == "amqp":
        app.conf.broker_transport_options = {"confirm_publish": True}
    dedupe.install(app)
    lease = worker_app.redelivered_long_lease.unique_lease

    @app.task(
        name=worker_app.redelivered_long_lease.name,
        bind=True,
        base=dedupe.DedupeTask,
        unique=True,
        unique_lease=lease,
        acks_late=True,
        reject_on_worker_lost=True,
        shared=False,
    )
    def redelivered_long_lease(self: Any, tag: str, seconds: float) -> str: ...

    worker = WorkerProcess(app, env)
    worker.start()
    try:
        yield Requeuing(app, redelivered_long_lease, worker)
    finally:
        worker.stop()
        if request.param == "amqp":
            with app.connection_for_write() as connection:
                connection.default_channel.queue_delete(queue)
        app.close()


def kill_the_first_run(
    worker_app: Any, redis_client: redis.Redis, requeuing: Requeuing, tag: str
) -> tuple[str, int, float]:
    """Call the task, SIGKILL its child once the body began; the call's id, the killed pid
    and when (wall clock, as the run log has it)."""
    result = requeuing.task.delay(tag, 60)
    wait_for(lambda: worker_app.runlog(tag).runs(), message="the first run's start")
    killed = int(redis_client.get(f"pid:{tag}") or 0)
    os.kill(killed, signal.SIGKILL)
    return result.id, killed, time.time()


def test_a_message_requeued_after_its_child_was_killed_runs_again_at_once(
    worker_app: Any, redis_client: redis.Redis, requeuing: Requeuing, tag: str
) -> None:
    assert requeuing.task.unique_lease >= 30  # waiting out the dead run's lease would fail
    task_id, killed, killed_at = kill_the_first_run(worker_app, redis_client, requeuing, tag)
    runs = wait_for(
        lambda: (found := worker_app.runlog(tag).runs())[1:] and found,
        timeout=requeuing.task.unique_lease,
        message="the redelivered message's run",
    )
    started_after = runs[1][1] - killed_at
    assert started_after < STARTS_WITHIN, (
        f"the redelivery started {started_after:.1f} s after the kill (lease "
        f"{requeuing.task.unique_lease:.0f} s): it waited for its own dead run's lease"
    )
    assert requeuing.app.AsyncResult(task_id).get(timeout=15) == tag
    runs = worker_app.runlog(tag).runs({killed: killed_at})
    assert [run[0] for run in runs] == [task_id, task_id]
    assert worker_app.runlog(tag).overlaps({killed: killed_at}) == []
    wait_for(
        lambda: dedupe.lookup(requeuing.task, (tag, 60)) is None, message="the run freed its key"
    )


def test_the_takeover_of_a_dead_runs_key_is_logged_once(
    worker_app: Any, redis_client: redis.Redis, requeuing: Requeuing, tag: str
) -> None:
    task_id, _, _ = kill_the_first_run(worker_app, redis_client, requeuing, tag)
    assert requeuing.app.AsyncResult(task_id).get(timeout=requeuing.task.unique_lease) == tag
    line = f"{requeuing.task.name}[{task_id}] took over the key of its own dead run"
    log = wait_for(
        lambda: (text := requeuing.worker.tail()).count(line) and text,
        message="the worker's line",
    )
    assert log.count(line) == 1
    assert f"waits: {task_id} is running" not in log
