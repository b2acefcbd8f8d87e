"""on_duplicate="replace": a duplicate of a queued call replaces its arguments (latest wins,
same task id); with unique_until="started", calls made during a run leave exactly one
follow-up run, with the last call's arguments. Real Redis, a real prefork worker."""

from __future__ import annotations

import time
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefork_worker")]


def test_a_queued_call_replaced_three_times_runs_once_with_the_last_arguments(
    worker_app: Any, tag: str
) -> None:
    first = worker_app.replaced.apply_async((tag, 0), countdown=1)
    later = [worker_app.replaced.delay(tag, value) for value in (1, 2, 3)]
    assert {result.id for result in later} == {first.id}
    assert [result.deduplicated for result in later] == [True] * 3
    assert first.get(timeout=20) == 3
    time.sleep(1)
    assert worker_app.values_run(tag) == [(first.id, "3")]


def test_calls_during_a_run_leave_one_follow_up_with_the_last_arguments(
    worker_app: Any, tag: str
) -> None:
    running = worker_app.replaced_after_run.delay(tag, 0, 2.0)
    deadline = time.monotonic() + 10
    while not worker_app.values_run(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    during = [worker_app.replaced_after_run.delay(tag, value) for value in (1, 2, 3)]
    follow_up = during[0]
    assert not follow_up.deduplicated
    assert {result.id for result in during} == {follow_up.id} != {running.id}
    assert [result.get(timeout=20) for result in during] == [3, 3, 3]
    assert running.get(timeout=20) == 0
    time.sleep(1)
    assert worker_app.values_run(tag) == [(running.id, "0"), (follow_up.id, "3")]
