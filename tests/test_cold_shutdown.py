"""A worker's cold shutdown (SIGQUIT) cancels its runs: Celery SIGTERMs each run's child
(``Request.cancel``), leaves an ``acks_late`` message unacked to come back, and its parent
sends no end signal for the run (the ``Terminated`` it sees next returns early). The slot is
freed in the child: billiard's SIGTERM handler raises SystemExit, and Celery's tracer sends
``task_postrun`` in a ``finally`` as it unwinds. If that ever changes, the redelivery meets
the cancelled run's slot (a 30 s lease) and is dropped as a copy of a live run: this fails.

Real ``celery worker -P prefork`` processes on the Redis broker, which puts the unacked
message back as the cancelled worker's channel closes.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.worker.consumer import Consumer

from .helpers import WorkerProcess, fail_on_keys_left, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def no_key_left_behind(redis_client: redis.Redis, worker_app: Any) -> Iterator[None]:
    yield
    fail_on_keys_left(redis_client, worker_app.PREFIX, within=3 * worker_app.LEASE + 3, shared=True)


def cold_shutdown(worker: WorkerProcess) -> None:
    """SIGQUIT to the worker's main process only (its children hear from it), and wait."""
    assert worker.process is not None
    os.kill(worker.process.pid, signal.SIGQUIT)
    worker.process.wait(timeout=20)


@pytest.mark.skipif(
    not hasattr(Consumer, "cancel_active_requests"),
    reason="this Celery's cold shutdown ends its runs as lost (WorkerLostError): none comes back",
)
def test_a_limited_run_cancelled_by_a_cold_shutdown_runs_again_on_another_worker(
    worker_app: Any, tag: str
) -> None:
    task = worker_app.limited_cancelled
    assert task.unique_lease >= 30  # a redelivery that waited out the slot would be too late
    queue = f"cancelled-{tag}"
    env = {"DEDUPE_TEST_QUEUE": queue}
    first, second = WorkerProcess(worker_app.app, env), WorkerProcess(worker_app.app, env)
    first.start()
    try:
        result = task.apply_async((tag,), queue=queue)
        wait_for(lambda: worker_app.runlog(tag).runs(), message="the first delivery's run")
        second.start()
        cold_shutdown(first)
        assert result.get(timeout=20) == 2
    finally:
        first.stop()
        second.stop()
