"""A DedupeTask's run claims its key as the worker accepts its message, where the accepting
process runs it (solo, threads): the claim's round trip overlaps Celery's own set-up, and
the run reads its answer as it starts. Prefork and green pools accept for another process
or greenlet: their runs claim as they start."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.worker import state
from kombu.utils.imports import symbol_by_name

import dedupe

from .conftest import in_process_worker
from .helpers import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def job(redis_app: Celery) -> Any:
    @redis_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> int:
        return x

    return job


@pytest.fixture
def accepted_by(redis_app: Celery, job: Any) -> Iterator[Any]:
    """Accept the next message of ``job``'s queue as Celery's worker does, with the task's
    own request class, for a pool process of the given pid (it is not run)."""
    requests: list[Any] = []

    def accept(pid: int) -> Any:
        with redis_app.connection_for_read() as connection:
            message = connection.SimpleQueue(redis_app.conf.task_default_queue).get(timeout=5)
            request_class = symbol_by_name(job.Request)
            request = request_class(message, app=redis_app, task=job)
            requests.append(request)
            request.on_accepted(pid, time.monotonic())
            message.ack()
        return request

    yield accept
    for request in requests:
        state.task_ready(request)  # (Celery's bookkeeping of a worker's active requests)


def test_a_solo_or_threads_pool_run_claims_its_key_as_its_message_is_accepted(
    job: Any, accepted_by: Any
) -> None:
    job.delay(1)
    accepted_by(os.getpid())  # (a solo or threads pool accepts in its own process)
    wait_for(
        lambda: (holder := dedupe.lookup(job, (1,))) is not None and holder.state == "running",
        message="the key claimed before the run started",
    )


def test_a_run_accepted_for_another_process_or_greenlet_claims_nothing_until_it_starts(
    job: Any, accepted_by: Any
) -> None:
    call = job.delay(1)
    accepted_by(os.getpid() + 1)  # (a prefork child's pid; a greenlet's id under gevent)
    holder = dedupe.lookup(job, (1,))
    assert holder is not None
    assert (holder.state, holder.task_id) == ("queued", call.id)


def test_a_run_reads_the_claim_sent_as_its_message_was_accepted_and_frees_the_key(
    redis_app: Celery, job: Any, no_keys_left: Any
) -> None:
    with in_process_worker(redis_app):
        assert job.delay(1).get(timeout=10) == 1
        assert job.delay(1).get(timeout=10) == 1  # (not held by a claim left behind)
        wait_for(lambda: dedupe.lookup(job, (1,)) is None, message="key freed")
    no_keys_left(redis_app)
