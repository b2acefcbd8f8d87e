"""A DedupeTask's run claims its key as the worker accepts its message, where the accepting
thread runs it (Celery's solo and threads pools): the claim's round trip overlaps Celery's
own set-up, and the run reads its answer as it starts. Other pools, and acks_late tasks,
claim as the run starts; a message Celery cannot run gives its claim back."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.concurrency import solo, thread
from celery.worker import state
from kombu.utils.imports import symbol_by_name

import dedupe
from dedupe.worker import early_claim

from .conftest import in_process_worker
from .helpers import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def solo_pool() -> Iterator[None]:
    """This process's worker pool is a solo one (as a worker sets it when it starts)."""
    before = early_claim.sends_at_acceptance()
    early_claim.pool_accepts_in_place("solo")
    yield
    early_claim.pool_accepts_in_place("solo" if before else None)


@pytest.fixture
def job(redis_app: Celery) -> Any:
    @redis_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> int:
        return x

    return job


@pytest.fixture
def accepted_by(redis_app: Celery, job: Any) -> Iterator[Any]:
    """Accept the next message of the queue as Celery's worker does, with the task's own
    request class (``job``'s by default), for a pool process of the given pid (it is not
    run)."""
    requests: list[Any] = []

    def accept(pid: int, task: Any = job) -> Any:
        with redis_app.connection_for_read() as connection:
            message = connection.SimpleQueue(redis_app.conf.task_default_queue).get(timeout=5)
            request_class = symbol_by_name(task.Request)
            request = request_class(message, app=redis_app, task=task)
            requests.append(request)
            request.on_accepted(pid, time.monotonic())
            message.ack()
        return request

    yield accept
    for request in requests:
        state.task_ready(request)  # (Celery's bookkeeping of a worker's active requests)


class _OwnPool(solo.TaskPool):  # type: ignore[misc]
    """A pool of one's own, built on the solo pool (it may run a message elsewhere)."""


@pytest.mark.parametrize(
    ("pool", "in_place"),
    [
        ("solo", True),
        ("threads", True),
        ("celery.concurrency.thread:TaskPool", True),
        (solo.TaskPool, True),
        (thread.TaskPool, True),
        ("prefork", False),
        ("gevent", False),
        ("eventlet", False),
        ("custom", False),
        ("my.pools:AsyncPool", False),
        (_OwnPool, False),
        (None, False),
    ],
)
def test_only_celerys_own_solo_and_threads_pools_send_claims_as_they_accept(
    pool: Any, in_place: bool
) -> None:
    early_claim.pool_accepts_in_place(pool)
    assert early_claim.sends_at_acceptance() is in_place


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
    _still_queued(job, call)


def test_a_worker_whose_pool_runs_messages_elsewhere_claims_nothing_as_it_accepts(
    job: Any, accepted_by: Any
) -> None:
    early_claim.pool_accepts_in_place("prefork")
    call = job.delay(1)
    accepted_by(os.getpid())
    _still_queued(job, call)


def test_an_acks_late_tasks_run_claims_nothing_until_it_starts(
    redis_app: Celery, accepted_by: Any
) -> None:
    @redis_app.task(shared=False, base=dedupe.DedupeTask, unique=True, acks_late=True)
    def late(x: int) -> int:
        return x

    call = late.delay(1)
    accepted_by(os.getpid(), late)
    _still_queued(late, call)


def test_a_message_celery_cannot_run_gives_back_the_claim_sent_as_it_was_accepted(
    redis_app: Celery, job: Any, redis_client: redis.Redis
) -> None:
    job.delay(1)
    queue = redis_app.conf.task_default_queue
    _break_keyword_arguments(redis_client, queue)
    with in_process_worker(redis_app):
        wait_for(lambda: redis_client.llen(queue) == 0, message="the message taken")
        # Its lease (60 s) would free it too: the key is free long before.
        wait_for(lambda: dedupe.lookup(job, (1,)) is None, timeout=5, message="the key freed")


def _break_keyword_arguments(client: redis.Redis, queue: str) -> None:
    """The queued message's keyword arguments become a list: Celery's tracer refuses it
    before the run starts (an internal error)."""
    raw = client.rpop(queue)
    assert raw is not None
    message = json.loads(raw)
    args, _, embed = json.loads(base64.b64decode(message["body"]))
    message["body"] = base64.b64encode(json.dumps([args, [1], embed]).encode()).decode()
    client.rpush(queue, json.dumps(message))


def test_a_run_reads_the_claim_sent_as_its_message_was_accepted_and_frees_the_key(
    redis_app: Celery, job: Any, no_keys_left: Any
) -> None:
    with in_process_worker(redis_app):
        assert job.delay(1).get(timeout=10) == 1
        assert job.delay(1).get(timeout=10) == 1  # (not held by a claim left behind)
        wait_for(lambda: dedupe.lookup(job, (1,)) is None, message="key freed")
    no_keys_left(redis_app)


def _still_queued(task: Any, call: Any) -> None:
    """The call's key still holds its queued record: nothing claimed it."""
    holder = dedupe.lookup(task, (1,))
    assert holder is not None
    assert (holder.state, holder.task_id) == ("queued", call.id)
