"""Decisions the prefork main process makes from Celery's signals, on a real Redis.

Real worker processes drive these paths in test_worker_prefork.py; here the same signals
are sent from outside any run (as the main process is) to pin down each decision.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, signals
from celery.exceptions import TimeLimitExceeded, WorkerLostError

import dedupe

from .helpers import CELERY_REQUEUES_TIMEOUTS


def _task(app: Celery, **options: Any) -> Any:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, **options)
    def job(x: int) -> None: ...

    return job


def test_a_lost_child_frees_the_key(app: Celery) -> None:
    job = _task(app)
    result = job.delay(1)
    signals.task_failure.send(
        sender=job, task_id=result.id, exception=WorkerLostError(), args=(1,), kwargs={}
    )
    assert dedupe.lookup(job, (1,)) is None


def test_a_hard_time_limit_frees_the_key(app: Celery) -> None:
    job = _task(app)
    result = job.delay(2)
    signals.task_failure.send(
        sender=job, task_id=result.id, exception=TimeLimitExceeded(1), args=(2,), kwargs={}
    )
    assert dedupe.lookup(job, (2,)) is None


@pytest.mark.skipif(
    not CELERY_REQUEUES_TIMEOUTS, reason="this Celery drops a timed-out acks_late message"
)
def test_a_hard_time_limit_that_celery_requeues_keeps_the_key_queued(app: Celery) -> None:
    job = _task(app, acks_late=True, acks_on_failure_or_timeout=False)
    result = job.delay(3)
    signals.task_failure.send(
        sender=job, task_id=result.id, exception=TimeLimitExceeded(1), args=(3,), kwargs={}
    )
    holder = dedupe.lookup(job, (3,))
    assert holder is not None
    assert (holder.task_id, holder.state) == (result.id, "queued")


@pytest.mark.skipif(
    CELERY_REQUEUES_TIMEOUTS, reason="this Celery requeues a timed-out acks_late message"
)
def test_a_hard_time_limit_under_acks_late_frees_the_key_when_celery_drops_the_message(
    app: Celery,
) -> None:
    job = _task(app, acks_late=True, acks_on_failure_or_timeout=False)
    result = job.delay(5)
    signals.task_failure.send(
        sender=job, task_id=result.id, exception=TimeLimitExceeded(1), args=(5,), kwargs={}
    )
    assert dedupe.lookup(job, (5,)) is None


def test_the_main_process_never_frees_a_key_another_task_holds(app: Celery) -> None:
    job = _task(app)
    holder = job.delay(4)
    signals.task_failure.send(
        sender=job, task_id="some-other-id", exception=WorkerLostError(), args=(4,), kwargs={}
    )
    found = dedupe.lookup(job, (4,))
    assert found is not None
    assert found.task_id == holder.id


def _running_here(app: Celery, job: Any, x: int, pid: int) -> Any:
    """Make x's key held by a run in process ``pid`` of this host, as a worker child would."""
    import socket
    import time

    from dedupe.runs.runtime import runtime_of

    result = job.delay(x)
    store = runtime_of(app).store
    keys = result.keys
    store.client.delete(keys.call)
    assert (
        store.claim(keys, result.id, "t1", 30_000, socket.gethostname(), pid, time.time()) is None
    )
    return result


def test_the_main_process_never_frees_a_run_that_is_still_alive(app: Celery) -> None:
    import os

    job = _task(app)
    result = _running_here(app, job, 5, os.getpid())  # alive: a copy still runs here
    signals.task_failure.send(
        sender=job, task_id=result.id, exception=WorkerLostError(), args=(5,), kwargs={}
    )
    holder = dedupe.lookup(job, (5,))
    assert holder is not None
    assert holder.state == "running"


def test_the_main_process_frees_the_run_of_a_child_that_died(app: Celery) -> None:
    import subprocess
    import sys

    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    job = _task(app)
    result = _running_here(app, job, 6, int(child.stdout))  # that process is gone
    signals.task_failure.send(
        sender=job, task_id=result.id, exception=WorkerLostError(), args=(6,), kwargs={}
    )
    assert dedupe.lookup(job, (6,)) is None


def test_the_main_process_frees_the_run_it_kills_for_its_time_limit(app: Celery) -> None:
    import os

    job = _task(app)
    result = _running_here(app, job, 7, os.getpid())  # still alive: about to be killed
    signals.task_failure.send(
        sender=job, task_id=result.id, exception=TimeLimitExceeded(1), args=(7,), kwargs={}
    )
    assert dedupe.lookup(job, (7,)) is None
