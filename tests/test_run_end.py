"""How a run ended is one value, whichever way the worker learns of it: the body's own end,
Celery's state at ``task_postrun``, or the exception ``task_failure`` carries."""

from __future__ import annotations

import pytest
from billiard.exceptions import WorkerLostError
from celery import states
from celery.exceptions import Reject, SoftTimeLimitExceeded, TimeLimitExceeded

from dedupe.runs.run_end import RunEnd


def test_a_body_that_returned_succeeded_and_one_that_raised_failed() -> None:
    assert RunEnd.of_body(returned=True) is RunEnd.SUCCEEDED
    assert RunEnd.of_body(returned=False) is RunEnd.FAILED


@pytest.mark.parametrize(
    ("state", "end"),
    [
        (states.SUCCESS, RunEnd.SUCCEEDED),
        (states.FAILURE, RunEnd.FAILED),
        (states.RETRY, RunEnd.RETRIED),
        (states.IGNORED, RunEnd.IGNORED),
    ],
)
def test_celerys_state_at_postrun_names_the_end(state: str, end: RunEnd) -> None:
    assert RunEnd.of_state(state, None) is end


def test_a_reject_that_requeues_is_told_from_one_that_does_not() -> None:
    assert RunEnd.of_state(states.REJECTED, Reject(requeue=True)) is RunEnd.REJECTED_TO_REQUEUE
    assert RunEnd.of_state(states.REJECTED, Reject(requeue=False)) is RunEnd.REJECTED


def test_a_state_celery_reports_for_no_known_end_is_a_failure() -> None:
    assert RunEnd.of_state(None, None) is RunEnd.FAILED
    assert RunEnd.of_state("SOMETHING_NEW", None) is RunEnd.FAILED


@pytest.mark.parametrize(
    ("exception", "end"),
    [
        (TimeLimitExceeded(10), RunEnd.TIMED_OUT),
        (WorkerLostError("killed"), RunEnd.LOST),
        (SoftTimeLimitExceeded(), RunEnd.FAILED),
        (ValueError("boom"), RunEnd.FAILED),
    ],
)
def test_the_exception_task_failure_carries_names_the_end(
    exception: BaseException, end: RunEnd
) -> None:
    assert RunEnd.of_exception(exception) is end


def test_only_errors_count_as_failed_ends() -> None:
    failed = {end for end in RunEnd if end.failed}
    assert failed == {RunEnd.FAILED, RunEnd.TIMED_OUT, RunEnd.LOST}
