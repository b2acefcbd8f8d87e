"""A debounce or a replace declared on a task applies to every call of it (``delay``,
``apply_async``), as ``key_concurrency`` does; and a retry that gives its own arguments
runs with them, not with the latest ones its first run took. Real Redis; the retries on a
real prefork worker."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

import dedupe


def test_a_debounce_declared_on_a_task_debounces_every_delay(redis_app: Celery) -> None:
    @redis_app.task(shared=False, base=dedupe.DedupeTask, unique_on=("x",), debounce=5)
    def burst(x: int, value: int) -> None: ...

    results = [burst.delay(1, value) for value in range(3)]
    assert [result.deduplicated for result in results] == [False, True, True]
    assert len({result.id for result in results}) == 1


def test_a_replace_declared_on_a_task_replaces_on_every_delay(redis_app: Celery) -> None:
    @redis_app.task(shared=False, base=dedupe.DedupeTask, unique_on=("x",), on_duplicate="replace")
    def latest(x: int, value: int) -> None: ...

    results = [latest.apply_async((1, value)) for value in range(3)]
    assert [result.deduplicated for result in results] == [False, True, True]
    assert len({result.id for result in results}) == 1


def test_a_debounce_declared_with_unique_false_is_refused_naming_the_task_and_the_fix(
    redis_app: Celery,
) -> None:
    decorate = redis_app.task(
        shared=False, name="proj.quiet", base=dedupe.DedupeTask, unique=False, debounce=5
    )
    redis_app.finalize()  # (a finalized app registers a task as it is decorated)
    with pytest.raises(dedupe.ConfigurationError, match=r"task 'proj\.quiet'.*drop unique=False"):
        decorate(_body)


def _body(x: int) -> None: ...


@pytest.mark.usefixtures("prefork_worker")
def test_a_retry_of_a_debounced_run_with_its_own_arguments_runs_with_them(
    worker_app: Any, tag: str
) -> None:
    results = [worker_app.debounced_retried_with.delay(tag, value) for value in range(3)]
    assert results[0].get(timeout=20) == "own"
    assert worker_app.values_run(tag) == [(results[0].id, "2"), (results[0].id, "own")]


@pytest.mark.usefixtures("prefork_worker")
def test_a_retry_of_a_replacing_run_with_its_own_arguments_runs_with_them(
    worker_app: Any, tag: str
) -> None:
    task = worker_app.replaced_retried_with
    # (The first waits a second: the two after it replace its arguments while it is queued.)
    results = [task.apply_async((tag, 0), countdown=1)]
    results += [task.delay(tag, value) for value in (1, 2)]
    assert results[0].get(timeout=20) == "own"
    assert worker_app.values_run(tag) == [(results[0].id, "2"), (results[0].id, "own")]
