"""The dedup Redis restarts while a run goes on, and every key is lost: one call per key is
let in (the key was empty), and no more; it runs after the run that lost its key, never
beside it. A real prefork worker; its dedup Redis a private server the test restarts.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import dedupe
from dedupe.demo.server import RedisServer

from .conftest import RedisFactory
from .helpers import WorkerProcess, app_with_a_store_of_its_own, wait_for

pytestmark = pytest.mark.slow

#: Seconds the run that loses its key goes on for.
RUN = 6.0


@dataclass
class Restarted:
    """A run whose key the restart lost, and the call accepted just after the restart."""

    task: Any
    first: Any
    second: Any
    store: RedisServer


def holder(task: Any, tag: str) -> dedupe.Holder | None:
    return dedupe.lookup(task, (tag, RUN))


@pytest.fixture
def restarted(redis_factory: RedisFactory, worker_app: Any, tag: str) -> Iterator[Restarted]:
    store = redis_factory()
    queue = f"restart-{tag}"
    with app_with_a_store_of_its_own(worker_app, worker_app.BROKER, queue, store) as producer:

        @producer.task(
            name=worker_app.sleepy.name,
            bind=True,
            base=dedupe.DedupeTask,
            unique=True,
            shared=False,
        )
        def sleepy(self: Any, tag: str, seconds: float) -> str: ...

        env = {"DEDUPE_TEST_QUEUE": queue, "DEDUPE_TEST_STORE": store.url}
        worker = WorkerProcess(producer, env)
        worker.start()
        assert worker.process is not None
        try:
            first = sleepy.delay(tag, RUN)
            wait_for(lambda: (h := holder(sleepy, tag)) and h.state == "running", message="running")
            # The worker is held still while Redis restarts, so that the call below comes
            # before the run's heartbeat can write its key again (as a call may, between two
            # beats).
            os.killpg(worker.process.pid, signal.SIGSTOP)
            try:
                store.stop()
                store.start()
                second = sleepy.apply_async((tag, RUN), countdown=1.5)
            finally:
                os.killpg(worker.process.pid, signal.SIGCONT)
            assert second.deduplicated is False  # the key was gone: this call is let in
            yield Restarted(sleepy, first, second, store)
            first.get(timeout=20)
            second.get(timeout=30)
        finally:
            worker.stop()


def test_after_a_redis_restart_one_call_is_let_in_until_it_has_run(
    restarted: Restarted, tag: str
) -> None:
    task, second = restarted.task, restarted.second
    while not ((h := holder(task, tag)) and h.state == "running" and h.task_id == second.id):
        assert task.delay(tag, RUN).deduplicated is True
        time.sleep(0.1)


def test_the_call_let_in_after_a_redis_restart_runs_after_the_run_that_lost_its_key(
    restarted: Restarted, worker_app: Any, tag: str
) -> None:
    restarted.first.get(timeout=20)
    restarted.second.get(timeout=30)
    runlog = worker_app.runlog(tag)
    assert [run[0] for run in runlog.runs()] == [restarted.first.id, restarted.second.id]
    assert runlog.overlaps() == []
