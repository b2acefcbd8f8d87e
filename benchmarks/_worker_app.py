"""The app of the prefork worker benchmark (benchmarks/worker.py): a no-op task of each
variant, and a count of runs shared by the worker's processes.

Imported by the benchmark and by the ``celery worker`` it starts, after
``DEDUPE_BENCH_WORKER_REDIS`` and ``DEDUPE_BENCH_WORKER_TASKS`` are set. The count lives in
memory the worker's main process maps before it forks its children: the last run of a round
pushes its first and last run's times to :data:`DONE`.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

import redis
from celery import signals

import dedupe

from . import _peers as peers
from ._env import worker_app

URL = os.environ.get("DEDUPE_BENCH_WORKER_REDIS", "redis://127.0.0.1:6379/0")
TASKS = int(os.environ.get("DEDUPE_BENCH_WORKER_TASKS", "500"))
QUEUE = "bench-prefork"
#: The list each round's first and last run's times (``"<first> <last>"``) go to.
DONE = "bench-prefork:done"

app = worker_app("bench-prefork", URL, QUEUE, task_ignore_result=True)
peers.configure(app, URL)


@app.task(ignore_result=True)
def plain_noop(i: int) -> None:
    """Celery alone."""


@app.task(base=dedupe.DedupeTask, unique=True, ignore_result=True)
def dedupe_noop(i: int) -> None:
    """A new key each call: every run claims and releases its key."""


VARIANTS: dict[str, Any] = {"plain": plain_noop, "dedupe": dedupe_noop}
VARIANTS.update(peers.tasks(app, ignore_result=True))

_runs = multiprocessing.Value("l", 0)
_first = multiprocessing.Value("d", 0.0)
_client: list[redis.Redis] = []


@signals.task_postrun.connect(weak=False)
def _ran(**_: object) -> None:
    with _runs.get_lock():
        _runs.value += 1
        runs = _runs.value
        if runs == 1:
            _first.value = time.perf_counter()
        if runs < TASKS:
            return
        _runs.value = 0
        first = _first.value
    if not _client:
        _client.append(redis.Redis.from_url(URL))
    _client[0].rpush(DONE, f"{first} {time.perf_counter()}")
