"""The app and tasks of benchmarks/timelines.py, one per flow-control mode.

Imported by the script (after it has set ``DEDUPE_TIMELINES_REDIS``) and by the ``celery
worker`` subprocess it starts (which inherits that variable). Each run writes the argument it
ran with, its start and end time and its pid to a Redis list per mode: ``timeline:<mode>``;
each delivery sent again instead of running (a debounced message that came early, a run that
waits its turn or its run lock: Celery's ``task_retry``), its time to ``timeline-again:<mode>``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery.signals import task_retry

import dedupe

from ._env import worker_app

URL = os.environ.get("DEDUPE_TIMELINES_REDIS", "redis://127.0.0.1:6379/0")
QUEUE = "timelines"

app = worker_app("timelines", URL, QUEUE, worker_prefetch_multiplier=1)

_redis = redis.Redis.from_url(URL)


def record(task: Any, mode: str, value: Any, seconds: float) -> Any:
    """Run for ``seconds``, then write the run to ``timeline:<mode>``."""
    start = time.time()
    time.sleep(seconds)
    run = {"id": task.request.id, "value": value, "start": start, "end": time.time()}
    _redis.rpush(f"timeline:{mode}", json.dumps({**run, "pid": os.getpid()}))
    return value


def runs(mode: str) -> list[dict[str, Any]]:
    """The runs of a mode so far, in start order."""
    found = [json.loads(raw) for raw in _redis.lrange(f"timeline:{mode}", 0, -1)]
    return sorted(found, key=lambda run: run["start"])


def sent_again(mode: str) -> list[dict[str, Any]]:
    """The deliveries of a mode sent again: task id, when, and in how many seconds."""
    return [json.loads(raw) for raw in _redis.lrange(f"timeline-again:{mode}", 0, -1)]


@task_retry.connect(weak=False)
def _sent_again(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
    mode = MODES.get(getattr(sender, "name", ""))
    if mode and request is not None:
        again = {"id": request.id, "at": time.time(), "countdown": getattr(reason, "when", None)}
        _redis.rpush(f"timeline-again:{mode}", json.dumps(again, default=str))


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique=True,
    unique_on=("key",),
    debounce=1,
    debounce_max_wait=3,
)
def debounced(self: Any, key: str, value: int, seconds: float) -> int:
    return record(self, "debounce", value, seconds)  # type: ignore[no-any-return]


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique=True,
    unique_on=("key",),
    on_duplicate="replace",
    unique_until="started",
)
def replaced(self: Any, key: str, value: int, seconds: float) -> int:
    return record(self, "replace", value, seconds)  # type: ignore[no-any-return]


@app.task(bind=True, base=dedupe.DedupeTask, unique_on=("key",), key_concurrency=2)
def two_at_once(self: Any, key: str, value: int, seconds: float) -> int:
    return record(self, "concurrency", value, seconds)  # type: ignore[no-any-return]


@app.task(bind=True, base=dedupe.DedupeTask, unique_on=("key",), key_rate_limit="2/s")
def two_per_second(self: Any, key: str, value: int, seconds: float) -> int:
    return record(self, "rate-limit", value, seconds)  # type: ignore[no-any-return]


#: Each task's mode.
MODES = {
    debounced.name: "debounce",
    replaced.name: "replace",
    two_at_once.name: "concurrency",
    two_per_second.name: "rate-limit",
}
