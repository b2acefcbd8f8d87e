"""A run's end, in the process that ran it: its key is freed as a DedupeTask's body ends
(before Celery stores the result), else at ``task_postrun``, or handed over to the
continuation it published.

Each way a run ends is seen where Celery reports it (``after_return`` misses most of them;
the list is in the design notes: docs/design-notes.md, "dedupe.worker.release").
"""

from __future__ import annotations

import functools
import time
from typing import Any, cast

from celery import states
from celery.backends.base import DisabledBackend
from kombu.utils.imports import symbol_by_name

from dedupe.compat.celery_private import pool_process_terminating
from dedupe.errors import RedisUnavailable
from dedupe.events import RELEASED, UNAVAILABLE, emit
from dedupe.runs.run import NO_RUN, Run, detach, run_of
from dedupe.runs.run_end import RunEnd
from dedupe.runs.runtime import Runtime, installed
from dedupe.surfaces import AnyTask, RequestSurface, TaskSurface
from dedupe.values.redelivery import horizon
from dedupe.values.timing import milliseconds

from . import limited_runs
from .request import ClaimingRequest
from .requeue import requeue_key
from .run_spec import latest_mode

__all__ = ["end_of_body", "on_postrun"]


def end_of_body(task: AnyTask, request: RequestSurface, end: RunEnd) -> None:
    """A DedupeTask's body returned, or raised an error that ends its run (``end``, from
    :meth:`RunEnd.of_body`; ``request``: the run's): free the key now, before Celery stores
    the result (a caller's ``.get()`` must never return while the key still names this
    finished run). Not a retry's, a reject's or a handed-over key: those stay for
    ``task_postrun``, as do runs of other bases (:func:`on_postrun`)."""
    run = run_of(request)
    runtime = installed(task.app)
    if (
        runtime is None
        or run is None
        or run.verdict != "claimed"
        or run.requeued
        or run.released
        or run.handover is not None
        or (end is not RunEnd.SUCCEEDED and _left_to_the_main_process(task, run))
    ):
        return
    if run.lease is not None:
        runtime.heartbeat.drop(run.lease)
        run.lease = None
    run.released = True
    # With a result to store, the release is read before it; else later (_release).
    wait = _stores_result(task, request, end)
    _release(runtime, task, request, cast("str", request.id), run, wait=wait)  # (a run's id)


def _release(
    runtime: Runtime,
    task: TaskSurface,
    request: RequestSurface,
    task_id: str,
    run: Run,
    *,
    wait: bool,
) -> None:
    """Free a claimed run's key: its reply read now (``wait``), or sent at once and read
    before this thread's next command to Redis (the next run's claim), by the sweeper
    within a fraction of a second, or as the pool process exits
    (:func:`~.lifecycle.on_process_shutdown`); sent again on a new connection if the old
    one died. (Read at the run's end, it cost a look at the socket that almost never found
    it: the reply was on its way.)"""
    keys = run.spec.keys
    try:
        if latest_mode(request, run.spec):
            # (Sent first: a release waited for lands it too, before the result and the ack.)
            _send_end_latest(runtime, request, task_id, run)
        if wait:
            runtime.store.release(keys, task_id, run.token)
        else:
            runtime.store.send_release(keys, task_id, run.token)
    except RedisUnavailable as exc:
        emit(UNAVAILABLE, task.name, task_id, keys.run, action=_NOT_FREED, error=exc.cause)
    else:
        emit(RELEASED, task.name, task_id, keys.run)


def _send_end_latest(runtime: Runtime, request: RequestSurface, task_id: str, run: Run) -> None:
    # The take kept for a resend goes, and the run's tombstone stays for as long as the broker
    # may deliver its message again: that delivery finds it, and does not run the burst twice
    # (a run killed before this point has none, and runs again with the take it kept).
    spec = run.spec
    horizon_ms = milliseconds(horizon(runtime.broker.redelivery, spec.lease, spec.ttl))
    retries = int(request.retries or 0)
    runtime.store.send_end_latest(spec.keys, task_id, retries, horizon_ms)


#: What a run's end did not do, when Redis could not be reached.
_NOT_FREED = "ended and its key was not freed (its lease frees it)"


def _stores_result(task: AnyTask, request: RequestSurface, end: RunEnd) -> bool:
    """May Celery store this run's outcome where a caller reads it? When in doubt, yes."""
    if isinstance(task.backend, DisabledBackend):
        return False
    if not (task.ignore_result and getattr(request, "ignore_result", False)):
        return True
    return end.failed and bool(getattr(task, "store_errors_even_if_ignored", False))


def on_postrun(
    sender: Any = None,
    task_id: str = "",
    task: AnyTask | None = None,
    retval: object = None,
    state: str | None = None,
    **_: object,
) -> None:
    """``task_postrun``: release the run's key (or requeue it with its message)."""
    task = task or sender
    request = task.request
    run = detach(request)
    runtime = installed(task.app)
    if runtime is not None and limited_runs.limited_run_of(request) is not None:
        limited_runs.leave(runtime, task)
    if run is None or runtime is None:
        return
    if run.lease is not None:
        runtime.heartbeat.drop(run.lease)
    if run.released:
        return
    if run.verdict == "held" or run.requeued:
        # Never touch the holder's record. A continuation (retry, replace) put the key back
        # to queued before its message was published; that message owns it now. (A RETRY
        # without one, a bare `raise Retry()`, publishes nothing and is released below.)
        return
    if run.handover is not None:
        _hand_over(runtime, task, task_id, run, *run.handover)
        return
    if state != states.SUCCESS and _left_to_the_main_process(task, run):
        return
    rejected = RunEnd.of_state(state, retval) is RunEnd.REJECTED_TO_REQUEUE
    if run.verdict == "claimed" and not (rejected and task.acks_late):
        _release(runtime, task, request, task_id, run, wait=False)
        return
    # A run whose claim failed (Redis was unreachable) holds no run: it speaks for its
    # queued record only, never for a copy of its task id that claimed since.
    token = run.token if run.verdict == "claimed" else NO_RUN
    spec = run.spec
    try:
        if rejected and task.acks_late:
            # The message goes back to the queue, and the record with it. (Without
            # acks_late the message was acked already: a requeue loses it.)
            requeue_key(runtime, spec.keys, spec.ttl, task_id, token, 0.0)
        else:
            # The claim's fate is unknown (Redis did not answer in time): it may have landed
            # after the worker gave up, as a running record of this run's token that no
            # heartbeat renews. Free it, and the queued record the claim would have replaced
            # (not a throttle window's: it lives out its ttl).
            runtime.store.release(spec.keys, task_id, run.token)
            if spec.until != "window":
                runtime.store.cancel(spec.keys, task_id)
            emit(RELEASED, task.name, task_id, spec.keys.run)
    except RedisUnavailable as exc:
        emit(UNAVAILABLE, task.name, task_id, spec.keys.run, action=_NOT_FREED, error=exc.cause)


def _left_to_the_main_process(task: TaskSurface, run: Run) -> bool:
    """Does the worker's main process settle this run's key, once its process is gone? The
    worker terminates the process (Celery's cancel, a revoke's terminate: billiard's own
    handler ran since the run started), and the task's request class is DedupeTask's, whose
    cancel it watches (and every revoke). The key stays as it stands meanwhile: freed now,
    a call would be accepted beside a message that comes back, or a new run start beside
    this one's unwinding. (Another task's run frees it as it unwinds.)"""
    return (
        not run.started_terminating
        and pool_process_terminating()
        and _request_class_claims(getattr(task, "Request", None))
    )


@functools.cache
def _request_class_claims(request_class: object) -> bool:
    # (A name, "module:Class", as Celery's own default is, or the class.)
    try:
        found = symbol_by_name(request_class) if isinstance(request_class, str) else request_class
    except Exception:  # (Celery's worker would fail on it too)
        return False
    return isinstance(found, type) and issubclass(found, ClaimingRequest)


def _hand_over(
    runtime: Runtime, task: TaskSurface, task_id: str, run: Run, ttl: float, eta: float | None
) -> None:
    """The run is over: its key goes back to queued for the continuation it published."""
    delay = max(0.0, eta - time.time()) if eta is not None else 0.0
    try:
        requeue_key(runtime, run.spec.keys, ttl, task_id, run.token, delay)
    except RedisUnavailable as exc:
        action = "ended and its key was not handed to its retry (its lease frees it)"
        emit(UNAVAILABLE, task.name, task_id, run.spec.keys.run, action=action, error=exc.cause)
    else:
        emit(RELEASED, task.name, task_id, run.spec.keys.run, requeued=True)
