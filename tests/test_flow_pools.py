"""key_concurrency's line on the pools whose worker claims at acceptance (solo, threads): the
calls run one at a time, in call order, each once, and none reads RETRY. A real worker in
this process (its runs are seen here); Redis is the broker and the dedup store."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import pytest
from celery import Celery

import dedupe

from .conftest import in_process_worker, unique_name


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_limited_calls_run_one_at_a_time_in_call_order_on_an_accepting_pool(
    make_app: Callable[..., Celery], pool: str
) -> None:
    app = make_app()
    runs: list[tuple[int, float, float]] = []
    lock = threading.Lock()

    @app.task(
        shared=False,
        base=dedupe.DedupeTask,
        name=unique_name("t"),
        unique_on=("tenant",),
        key_concurrency=1,
    )
    def limited(tenant: int, index: int) -> int:
        began = time.monotonic()
        time.sleep(0.2)
        with lock:
            runs.append((index, began, time.monotonic()))
        return index

    results = [limited.delay(7, index) for index in range(4)]
    states: set[str] = set()
    with in_process_worker(app, pool=pool, concurrency=4):
        deadline = time.monotonic() + 30
        while not all(result.ready() for result in results) and time.monotonic() < deadline:
            states.update(result.state for result in results)
            time.sleep(0.02)
        assert [result.get(timeout=5) for result in results] == [0, 1, 2, 3]
    in_order = sorted(runs, key=lambda run: run[1])
    assert [index for index, _, _ in in_order] == [0, 1, 2, 3]
    assert all(after[1] >= before[2] for before, after in itertools.pairwise(in_order))
    assert "RETRY" not in states
