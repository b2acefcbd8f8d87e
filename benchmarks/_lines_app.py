"""The app and tasks of benchmarks/lines.py: a plain task and a ``key_concurrency=1`` task,
each a 10 ms run. Imported by the script (after it set ``DEDUPE_LINES_REDIS``) and by the
``celery worker`` subprocess it starts (which inherits that variable)."""

from __future__ import annotations

import os
import time

import dedupe

from ._env import worker_app

URL = os.environ.get("DEDUPE_LINES_REDIS", "redis://127.0.0.1:6379/0")
QUEUE = "lines"
RUN = 0.010

app = worker_app("lines", URL, QUEUE, result_backend=URL, result_expires=600)


@app.task
def plain(tenant: int, index: int) -> int:
    time.sleep(RUN)
    return index


@app.task(base=dedupe.DedupeTask, unique_on=("tenant",), key_concurrency=1)
def limited(tenant: int, index: int) -> int:
    time.sleep(RUN)
    return index
