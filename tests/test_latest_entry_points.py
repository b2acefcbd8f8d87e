"""debounce and on_duplicate="replace" through every producer entry point: a duplicate made
through apply_many, aapply_many or aapply_async (and the task methods on them) leaves its
arguments for the holder's run, as one made through delay does; calls of one key within one
batch collapse, the last one's arguments winning. Real Redis, a real prefork worker."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from celery import Celery

import dedupe
from dedupe.producer.guard import keys_of_call
from dedupe.runs.runtime import runtime_of
from dedupe.values.latest import unpack_arguments

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefork_worker")]


def test_a_batch_duplicate_of_a_debounced_call_leaves_its_arguments_for_the_run(
    worker_app: Any, tag: str
) -> None:
    first = worker_app.debounced.delay(tag, 0)
    [again] = dedupe.apply_many(worker_app.debounced, [((tag, 1), {})])
    assert (again.deduplicated, again.id) == (True, first.id)
    assert first.get(timeout=20) == 1
    time.sleep(1.5)  # (a second run would have started by now)
    assert worker_app.values_run(tag) == [(first.id, "1")]


def test_calls_of_one_debounced_key_in_one_batch_run_once_with_the_last_ones_arguments(
    worker_app: Any, tag: str
) -> None:
    results = worker_app.debounced.map_unique([(tag, value) for value in range(4)])
    assert [result.deduplicated for result in results] == [False, True, True, True]
    assert {result.id for result in results} == {results[0].id}
    assert results[0].get(timeout=20) == 3
    time.sleep(1.5)
    assert worker_app.values_run(tag) == [(results[0].id, "3")]


def test_a_batch_duplicate_moves_the_debounce_deadline(worker_app: Any, tag: str) -> None:
    task = worker_app.debounced
    first = task.delay(tag, 0)
    task.delay(tag, 1)
    left_by_delay = _deadline(worker_app, tag, first.id)
    dedupe.apply_many(task, [((tag, 2), {})])
    assert _deadline(worker_app, tag, first.id) > left_by_delay


def _deadline(worker_app: Any, tag: str, task_id: str) -> float:
    """The deadline the duplicates of ``task_id``'s call left for its run (looked at only)."""
    _, keys = keys_of_call(worker_app.debounced, (tag, 0), None, None, {})
    latest = runtime_of(worker_app.app).store.take_latest(keys, task_id, 0, now=time.time())
    assert latest is not None
    return latest.deadline


def test_a_burst_made_through_aapply_async_runs_once_with_the_last_arguments_under_one_id(
    worker_app: Any, tag: str
) -> None:
    async def burst() -> list[dedupe.DedupeResult]:
        results = []
        for value in range(6):
            results.append(await dedupe.aapply_async(worker_app.debounced, args=(tag, value)))
            await asyncio.sleep(0.1)
        return results

    results = asyncio.run(burst())
    assert [result.deduplicated for result in results] == [False] + [True] * 5
    assert {result.id for result in results} == {results[0].id}
    assert results[0].get(timeout=20) == 5
    time.sleep(1.5)
    assert worker_app.values_run(tag) == [(results[0].id, "5")]


def test_a_queued_call_replaced_by_async_calls_runs_with_the_last_replacements_arguments(
    worker_app: Any, tag: str
) -> None:
    first = worker_app.replaced.apply_async((tag, 0), countdown=2)

    async def replacements() -> list[dedupe.DedupeResult]:
        return [await worker_app.replaced.adelay_unique(tag, value) for value in range(1, 9)]

    later = asyncio.run(replacements())
    assert [(result.deduplicated, result.id) for result in later] == [(True, first.id)] * 8
    assert first.get(timeout=20) == 8
    time.sleep(1)
    assert worker_app.values_run(tag) == [(first.id, "8")]


def test_a_queued_call_replaced_through_an_async_batch_runs_with_the_last_replacement(
    worker_app: Any, tag: str
) -> None:
    first = worker_app.replaced.apply_async((tag, 0), countdown=1)
    batch = asyncio.run(dedupe.aapply_many(worker_app.replaced, [((tag, 1), {}), ((tag, 2), {})]))
    assert [(result.deduplicated, result.id) for result in batch] == [(True, first.id)] * 2
    assert first.get(timeout=20) == 2
    time.sleep(1)
    assert worker_app.values_run(tag) == [(first.id, "2")]


@pytest.fixture
def replacing(app: Celery) -> Any:
    @app.task(
        shared=False, base=dedupe.DedupeTask, unique=True, unique_on=("x",), on_duplicate="replace"
    )
    def replacing(x: int, value: int) -> None: ...

    return replacing


def _left_for(task: Any, task_id: str) -> Any:
    """The arguments the duplicates of ``task_id``'s call (``x=1``) left for its run."""
    runtime, keys = keys_of_call(task, (1, 0), None, None, {})
    latest = runtime.store.take_latest(keys, task_id, 0)
    return None if latest is None else unpack_arguments(latest.body)


def test_a_batchs_calls_of_one_replacing_key_leave_the_last_ones_arguments_on_any_broker(
    replacing: Any,
) -> None:
    results = dedupe.apply_many(replacing, [((1, value), {}) for value in range(3)])
    assert [result.deduplicated for result in results] == [False, True, True]
    assert _left_for(replacing, results[0].id) == ([1, 2], {})


def test_an_async_duplicate_of_a_replacing_call_leaves_its_arguments_on_any_broker(
    replacing: Any,
) -> None:
    first = replacing.apply_async((1, 0), countdown=60)
    again = asyncio.run(dedupe.aapply_async(replacing, args=(1, 1)))
    assert (again.deduplicated, again.id) == (True, first.id)
    assert _left_for(replacing, first.id) == ([1, 1], {})


def test_a_keys_last_call_in_a_later_chunk_of_a_large_batch_leaves_its_arguments(
    replacing: Any,
) -> None:
    # (A batch is decided 256 calls per script: the key's first call and its last are in
    # two scripts of one round trip.)
    calls = [((1, 0), {}), *(((x, 0), {}) for x in range(2, 300)), ((1, 299), {})]
    results = dedupe.apply_many(replacing, calls)
    assert (results[-1].deduplicated, results[-1].id) == (True, results[0].id)
    assert _left_for(replacing, results[0].id) == ([1, 299], {})
