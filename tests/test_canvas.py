"""Canvas rule: members of a chain, group or chord are never refused at enqueue time (a refused
member would hang or cut its workflow); the execution guard keeps their runs apart and
defers, never skips, a member that meets a live run of its key."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group

import dedupe

from .conftest import in_process_worker
from .helpers import RunLog, keys_with_prefix, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def tasks(app: Celery, runlog: RunLog) -> Any:
    class Tasks:
        @staticmethod
        @app.task(
            shared=False, base=dedupe.DedupeTask, unique=True, bind=True, on_running_countdown=0.1
        )
        def step(self: Any, x: int) -> int:
            runlog.started(self.request.id)
            time.sleep(0.2)
            runlog.ended(self.request.id)
            return x + 1

        @staticmethod
        @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
        def total(values: list[int]) -> int:
            return sum(values)

    return Tasks


def test_a_chain_completes_when_its_first_member_is_already_queued(
    app: Celery, tasks: Any, queue_length: Any
) -> None:
    alone = tasks.step.delay(1)
    workflow = chain(tasks.step.s(1), tasks.step.s(), tasks.step.s()).apply_async()
    assert queue_length(app) == 2  # the chain's member was not refused
    with in_process_worker(app):
        assert workflow.get(timeout=20) == 4
        assert alone.get(timeout=20) == 2


def test_a_chain_completes_when_a_later_member_duplicates_a_queued_call(
    app: Celery, tasks: Any
) -> None:
    waiting = tasks.step.delay(3)  # the chain's second step will be step(3)
    with in_process_worker(app):
        assert chain(tasks.step.s(2), tasks.step.s()).apply_async().get(timeout=20) == 4
        waiting.get(timeout=20)


def test_a_group_of_identical_calls_runs_every_member_one_at_a_time(
    app: Celery, tasks: Any, runlog: RunLog
) -> None:
    with in_process_worker(app, pool="threads", concurrency=3):
        assert group(tasks.step.s(7) for _ in range(3)).apply_async().get(timeout=30) == [8, 8, 8]
    assert len(runlog.runs()) == 3
    assert runlog.overlaps() == []


def test_a_chord_fires_its_unique_body_even_when_that_call_is_queued(
    app: Celery, tasks: Any
) -> None:
    pending_body = tasks.total.delay([2, 3, 4])
    with in_process_worker(app, pool="threads", concurrency=2):
        workflow = chord([tasks.step.s(1), tasks.step.s(2), tasks.step.s(3)], tasks.total.s())
        assert workflow.apply_async().get(timeout=30) == 9
        assert pending_body.get(timeout=20) == 9


def test_no_key_is_left_after_a_workflow(
    app: Celery, tasks: Any, redis_client: redis.Redis
) -> None:
    with in_process_worker(app, pool="threads", concurrency=2):
        chain(tasks.step.s(1), group(tasks.step.s(), tasks.step.s())).apply_async().get(timeout=30)
        wait_for(
            lambda: keys_with_prefix(redis_client, app.conf.dedupe_key_prefix) == [],
            message="all keys freed",
        )
