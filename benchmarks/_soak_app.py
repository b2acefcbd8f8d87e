"""The app and tasks of benchmarks/soak.py, one per kind of call the soak's producers make.

Imported by the soak's producers and by the ``celery worker`` subprocess it starts, after
``DEDUPE_SOAK_REDIS`` is set (the worker inherits it). Every run adds one to the
:data:`RUNS` counter, so that the soak reads the worker's rate without asking the worker.
"""

from __future__ import annotations

import os

import redis

import dedupe

from ._env import worker_app

URL = os.environ.get("DEDUPE_SOAK_REDIS", "redis://127.0.0.1:6379/0")
QUEUE = "soak"
PREFIX = "soak"
#: The counter of runs, in the soak's Redis.
RUNS = "soak-runs"

app = worker_app(PREFIX, URL, QUEUE, task_ignore_result=True)

_redis = redis.Redis.from_url(URL)


def _ran() -> None:
    _redis.incr(RUNS)


@app.task
def plain(i: int) -> None:
    """Celery alone (``--mix plain``): what growth is Celery's own."""
    _ran()


@app.task(base=dedupe.DedupeTask, unique=True)
def fresh(i: int) -> None:
    """Called with a new argument each time: every call accepted, every run frees its key."""
    _ran()


@app.task(base=dedupe.DedupeTask, unique=True)
def repeat(k: int) -> None:
    """Called on a few keys over and over: mostly duplicates, a run now and then."""
    _ran()


@app.task(base=dedupe.DedupeTask, unique=True)
def hot() -> None:
    """One key called by every producer all the time."""
    _ran()


@app.task(base=dedupe.DedupeTask, unique=True, unique_on=("k",), debounce=1, debounce_max_wait=3)
def debounced(k: int, value: int) -> None:
    """Flow-controlled: one run per burst of a key, a second after its last call."""
    _ran()


@app.task(base=dedupe.DedupeTask, unique_on=("k",), key_concurrency=2, key_rate_limit="20/s")
def limited(k: int, value: int) -> None:
    """Flow-controlled: two at once and 20 a second per key, offered fewer than that (more
    would make a backlog that grows by design)."""
    _ran()
