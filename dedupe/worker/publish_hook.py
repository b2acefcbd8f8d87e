"""``before_task_publish`` in a run: a continuation of the running task id (a retry, a
replace) that a task of another base class publishes takes the key back to queued."""

from __future__ import annotations

import time
from typing import Any

from dedupe.compat.celery_private import current_worker_task
from dedupe.runs.run import NO_RUN, run_of
from dedupe.runs.runtime import installed
from dedupe.values.header import KeyHeader, is_publishing

from .requeue import requeue_for_message, ttl_and_delay

__all__ = ["on_publish_in_run"]


def on_publish_in_run(
    sender: object = None, headers: dict[str, Any] | None = None, **_: object
) -> None:
    """``before_task_publish`` in a run: a retry (or replace) of the running task id, sent by a
    task of another base class (a DedupeTask's own apply_async handles its continuations),
    takes the key back to queued before its message exists (it may start at once elsewhere).
    """
    if is_publishing() or not headers:
        return
    current = current_worker_task()
    header = KeyHeader.read(headers)
    task_id = headers.get("id")
    if current is None or header is None or not task_id or current.request.id != task_id:
        return  # not in a run, not our message, or a new call with copied headers
    run = run_of(current.request)
    runtime = installed(current.app)
    if run is None or run.requeued or runtime is None:
        return
    ttl, delay = ttl_and_delay(runtime, header, headers)
    if run.hand_over_at_end(current, header.keys, ttl, time.time() + delay if delay else None):
        return  # on_postrun hands the key over
    token = run.hand_over(header.keys, runtime.heartbeat)
    if token != NO_RUN:
        requeue_for_message(runtime, header, task_id, token, headers)
