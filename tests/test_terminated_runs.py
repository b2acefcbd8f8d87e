"""Runs the worker terminates (a revoke's terminate, a cold shutdown) leave keys that tell
the truth: the key of a run whose process is being terminated is settled by the worker's
main process once that process is gone, whatever the key's mode; a process that swallowed
its terminate and lives on frees the keys of the runs it runs next; and a cold shutdown's
main process settles its cancelled runs' keys before it exits.

Real ``celery worker -P prefork`` processes (the session's, or one of the test's own); the
tasks have 30 s leases, so a key freed within seconds was freed by the worker, not the lease.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import dedupe

from .helpers import WorkerProcess, fail_on_keys_left, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def no_key_left_behind(redis_client: redis.Redis, worker_app: Any) -> Iterator[None]:
    yield
    fail_on_keys_left(redis_client, worker_app.PREFIX, within=3 * worker_app.LEASE + 3, shared=True)


def _own_worker(worker_app: Any, tag: str) -> WorkerProcess:
    """A worker of one pool process, on a queue of its own."""
    worker = WorkerProcess(worker_app.app, {"DEDUPE_TEST_QUEUE": f"terminated-{tag}"}, 1)
    worker.start()
    return worker


def _running(task: Any, args: tuple[Any, ...]) -> Any:
    return wait_for(
        lambda: (h := dedupe.lookup(task, args)) is not None and h.state == "running" and h,
        message=f"{task.name}{args} running",
    )


def _freed(task: Any, args: tuple[Any, ...], by: str) -> None:
    """Wait for the key of ``task(*args)`` to be free: within 5 s, by ``by`` (its lease is
    30 s)."""
    wait_for(
        lambda: dedupe.lookup(task, args) is None,
        timeout=5,
        message=f"freed by {by} (the lease is 30 s)",
    )


def _swallowed_terminate(worker_app: Any, tag: str, queue: str) -> None:
    """A run that swallows its process's terminate and returns, in the worker of ``queue``."""
    first = worker_app.swallows_its_stop.apply_async((tag, 30), queue=queue)
    _running(worker_app.swallows_its_stop, (tag, 30))
    first.revoke(terminate=True)
    events = redis.Redis.from_url(worker_app.REDIS)
    wait_for(lambda: events.get(f"swallowed:{tag}"), message="the terminate swallowed")


def test_a_run_that_swallows_its_terminate_and_returns_frees_its_key(
    worker_app: Any, tag: str
) -> None:
    worker = _own_worker(worker_app, tag)
    try:
        _swallowed_terminate(worker_app, tag, f"terminated-{tag}")
        _freed(worker_app.swallows_its_stop, (tag, 30), by="its run")
    finally:
        worker.stop()


def test_a_process_that_swallowed_its_terminate_frees_the_keys_of_its_next_runs(
    worker_app: Any, tag: str
) -> None:
    worker = _own_worker(worker_app, tag)
    try:
        queue = f"terminated-{tag}"
        _swallowed_terminate(worker_app, tag, queue)
        # The same process, its terminate flag still set, runs the next call to its end.
        assert worker_app.sleepy_long_lease.apply_async((tag, 0), queue=queue).get(10) == tag
        _freed(worker_app.sleepy_long_lease, (tag, 0), by="its run")
    finally:
        worker.stop()


@pytest.mark.usefixtures("prefork_worker")
def test_a_terminated_run_frees_its_run_lock_once_gone_while_a_call_waits(
    worker_app: Any, tag: str
) -> None:
    # unique_until="started": the call key holds the call accepted during the run, the run
    # lock a key of its own. Freed only by its 30 s lease, the second call would wait it out.
    task = worker_app.started_long_lease
    first = task.delay(tag, 30)
    _running(task, (tag, 30))
    second = task.delay(tag, 30)
    assert not second.deduplicated
    first.revoke(terminate=True)
    wait_for(
        lambda: len(worker_app.runlog(tag).runs()) == 2,
        timeout=10,
        message="the waiting call's run (the run lock's lease is 30 s)",
    )
    second.revoke(terminate=True)


def test_a_cold_shutdown_frees_the_key_of_the_run_it_cancels_before_it_exits(
    worker_app: Any, tag: str
) -> None:
    # Not acks_late: the message was acked, and the key goes with the run, once its process
    # is gone; the main process waits for that (a second and a half) before it exits.
    worker = _own_worker(worker_app, tag)
    try:
        task = worker_app.slow_to_stop
        task.apply_async((tag, 30), queue=f"terminated-{tag}")
        _running(task, (tag, 30))
        assert worker.process is not None
        os.kill(worker.process.pid, signal.SIGQUIT)
        worker.process.wait(timeout=20)
        _freed(task, (tag, 30), by="the worker")
    finally:
        worker.stop()
