"""Worker side, in the prefork pool's parent (Celery's MainProcess): keys of runs it lost,
revoked, cancelled or is killing, and the continuation it sends itself
(``retry_on_worker_lost``).

These handlers act for "any run" of a task id only when the run in the record is known dead
or being killed by this process (:func:`dedupe.runs.liveness.lost_run_token`): a live copy of the
task, in another child or on another host, is never touched.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from celery.app.task import Context, Task

from dedupe.compat.celery_private import current_app, current_worker_task
from dedupe.errors import DedupeError, RedisUnavailable
from dedupe.events import RECLAIMED, UNAVAILABLE, emit
from dedupe.runs.liveness import lost_run_token, run_is_dead
from dedupe.runs.run import NO_RUN, RunSpec
from dedupe.runs.run_end import RunEnd
from dedupe.runs.runtime import Runtime, installed
from dedupe.surfaces import AnyTask, RequestSurface, TaskSurface
from dedupe.values.header import KeyHeader, is_publishing
from dedupe.values.limits import LimitHeader
from dedupe.values.redelivery import horizon

from .limited_runs import free_dead_slots, leave_line
from .requeue import requeue_for_message, requeue_key
from .run_spec import derived_spec, spec_for_request

__all__ = ["on_cancelled", "on_failure", "on_publish_in_parent", "on_revoked"]

logger = logging.getLogger("dedupe.worker")


def on_failure(
    sender: AnyTask | None = None,
    task_id: str = "",
    exception: object = None,
    args: Sequence[object] | None = None,
    kwargs: Mapping[str, object] | None = None,
    **_: object,
) -> None:
    """``task_failure`` after a killed child or a hard time limit.

    In the process that ran the task, ``task_postrun`` follows and handles it. Here: a lost
    child's message is not redelivered (else Celery sends no task_failure), so the key goes;
    a hard time limit under acks_late (acks_on_timeout off) requeues the message, and the key
    with it.
    """
    if sender is None or current_worker_task() is not None:
        return
    timed_out = RunEnd.of_exception(exception) is RunEnd.TIMED_OUT
    current = sender.request  # (after a lost child, Celery pushed its request here)
    limit = LimitHeader.read(getattr(current, "headers", None)) if current.id == task_id else None
    if limit is not None:
        if not timed_out:  # (the child is gone; a hard time limit's slot waits for its lease)
            free_dead_slots(sender, task_id, limit)
        return
    requeue = timed_out and _requeued_on_timeout(sender)
    _act_for_lost_run(sender, task_id, args, kwargs, requeue=requeue, killing=timed_out)


def on_revoked(
    sender: AnyTask | None = None,
    request: Context | None = None,
    terminated: bool = False,
    signum: object = None,
    **_: object,
) -> None:
    """``task_revoked``: a message revoked before it ran, expired, or terminated."""
    if sender is None or request is None:
        return
    limit = LimitHeader.read(getattr(request, "headers", None))
    if limit is not None:
        if not terminated:
            leave_line(sender, request.id, limit)
        return  # (a terminated run's slot is freed by its lease)
    if terminated and signum != signal.SIGKILL:
        # Celery announces the terminate as it sends the signal. A run may handle it (SIGUSR1
        # raises SoftTimeLimitExceeded, SIGTERM may be caught) and go on cleaning up: its key
        # goes when the run is over, never while it may still run beside a new one.
        _when_over(sender, request, requeue=False)
        return
    _act_for_lost_run(
        sender, request.id, request.args, request.kwargs, request, killing=bool(terminated)
    )


def on_publish_in_parent(
    sender: object = None, headers: dict[str, Any] | None = None, **_: object
) -> None:
    """``before_task_publish`` outside any run: ``retry_on_worker_lost`` sends a dead child's
    message again; its key goes back to queued before the message exists."""
    if is_publishing() or not headers or current_worker_task() is not None:
        return
    header = KeyHeader.read(headers)
    task_id = headers.get("id")
    runtime = installed(current_app())
    if header is None or not task_id or runtime is None:
        return
    try:
        token = lost_run_token(runtime.store, header.keys)
    except RedisUnavailable as exc:
        logger.warning("could not requeue the key of %s: %s", task_id, exc.cause)
        return
    requeue_for_message(runtime, header, task_id, token, headers)


# Celery 5.7 split acks_on_failure_or_timeout and began to requeue a timed-out acks_late
# message; before, such a message was acked or dropped, and a key kept for it would be stuck.
_TIMEOUT_CAN_REQUEUE = hasattr(Task, "acks_on_timeout")


def _requeued_on_timeout(task: TaskSurface) -> bool:
    """Whether Celery requeues the message of a run killed by its hard time limit."""
    if not task.acks_late or not _TIMEOUT_CAN_REQUEUE:
        return False
    value = getattr(task, "acks_on_timeout", None)
    if value is None:
        value = getattr(task, "acks_on_failure_or_timeout", True)
    return not value


def _act_for_lost_run(
    task: AnyTask,
    task_id: str | None,
    args: Sequence[object] | None,
    kwargs: Mapping[str, object] | None,
    request: RequestSurface | None = None,
    *,
    requeue: bool = False,
    killing: bool = False,
) -> None:
    """Release (or requeue) a task id's key for the run this process lost, revoked or is
    killing: never over a copy of the task that still runs."""
    runtime = installed(task.app)
    if runtime is None or not task_id:
        return
    spec = _spec_of_lost_run(runtime, task, args, kwargs, request, task_id)
    if spec is None:
        return
    try:
        token = lost_run_token(runtime.store, spec.keys, killing=killing)
        if requeue:
            requeue_key(runtime, spec.keys, spec.ttl, task_id, token, 0.0)
        # A release may free nothing: the record went already (a revoke freed it while its
        # message waited), or a newer call holds the key. Only a freed key is reported.
        reclaimed = requeue or runtime.store.release(spec.keys, task_id, token) > 0
    except RedisUnavailable as exc:
        action = "was lost and its key was not freed (its lease frees it)"
        emit(UNAVAILABLE, task.name, task_id, spec.keys.run, action=action, error=exc.cause)
    else:
        if reclaimed:
            emit(RECLAIMED, task.name, task_id, spec.keys.run, requeued=requeue)


#: Seconds between two looks at a terminated run's key, for its lease; then _WATCH_LATER.
_WATCH_EVERY = 0.2
_WATCH_LATER = 2.0
#: Seconds the process waits at its exit for the watches of runs it terminated (a cold
#: shutdown terminates its runs and exits: their children are gone within moments).
_WATCHES_AT_EXIT = 3.0

_watches: set[threading.Thread] = set()
os.register_at_fork(after_in_child=_watches.clear)  # (a pool child watches nothing)


@atexit.register
def _settle_watched() -> None:
    deadline = time.monotonic() + _WATCHES_AT_EXIT
    for watch in list(_watches):
        watch.join(max(0.0, deadline - time.monotonic()))


def on_cancelled(task: AnyTask, request: Context, *, acknowledged: bool) -> None:
    """Celery cancelled a running run (``Request.cancel``: a broker connection lost under
    ``worker_cancel_long_running_tasks_on_connection_loss``, a cold shutdown) and terminated
    its process, which leaves the key as it stands. Once that process is gone, the key goes
    back to queued for the message the broker delivers again; an ``acknowledged`` message is
    gone, and its key with the run."""
    if LimitHeader.read(getattr(request, "headers", None)) is not None:
        return  # (a limited run's slot is freed in its process as it unwinds)
    _when_over(task, request, requeue=not acknowledged)


def _when_over(task: AnyTask, request: Context, *, requeue: bool) -> None:
    """Once the process of a run this process terminated is gone, free its key, or put it
    back to queued (``requeue``: its message comes back)."""
    runtime = installed(task.app)
    task_id = request.id
    if runtime is None or not task_id:
        return
    spec = _spec_of_lost_run(runtime, task, request.args, request.kwargs, request, task_id)
    if spec is None:
        return
    store, keys = runtime.store, spec.keys
    # (Its message may come back as late as a dead run's record lives: requeued as long.)
    ttl = max(spec.ttl, horizon(runtime.broker.redelivery, spec.lease, spec.ttl))
    often_until = time.monotonic() + spec.lease

    def watch() -> None:
        try:
            while True:
                try:
                    # The run key: the call's own record holds calls accepted since, in the
                    # modes that free it as the run starts.
                    holder = store.run_holder(keys)
                    if holder is None or holder.task_id != task_id or holder.state != "running":
                        return  # the run ended and freed its key (or handed it over)
                    if run_is_dead(holder):
                        # Exactly this run's: a redelivered copy that took over is left be.
                        token = holder.run_token or NO_RUN
                        if requeue:
                            requeue_key(runtime, keys, ttl, task_id, token, 0.0)
                        else:
                            store.release(keys, task_id, token)
                        emit(RECLAIMED, task.name, task_id, keys.run, requeued=requeue)
                        return
                except RedisUnavailable:
                    pass  # look again
                time.sleep(_WATCH_EVERY if time.monotonic() < often_until else _WATCH_LATER)
        finally:
            _watches.discard(threading.current_thread())

    thread = threading.Thread(target=watch, name=f"dedupe-terminated-{task_id}", daemon=True)
    _watches.add(thread)
    thread.start()


def _spec_of_lost_run(
    runtime: Runtime,
    task: AnyTask,
    args: Sequence[object] | None,
    kwargs: Mapping[str, object] | None,
    request: RequestSurface | None,
    task_id: str,
) -> RunSpec | None:
    if request is None:
        # task_failure after a lost child pushes the request; a hard time limit does not.
        current = task.request
        request = current if current.id == task_id else None
    try:
        if request is not None:
            return spec_for_request(runtime, task, request, args or (), kwargs or {})
        return derived_spec(runtime, task, args or (), kwargs or {})
    except DedupeError as exc:
        logger.error("cannot find the key of %s[%s]: %s", task.name, task_id, exc)
    return None
