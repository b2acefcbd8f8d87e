"""Before a run's body (``DedupeTask.before_start``): refuse a run in a worker whose app is not
installed, and stop a run whose key another run holds: skip it, or defer it (and, for a
message the producer accepted, wait in line in its holder's place)."""

from __future__ import annotations

import logging
import time
import weakref
from typing import NoReturn

from celery import Celery
from celery.app.task import Context
from celery.exceptions import Ignore

from dedupe.errors import DedupeError, NotInstalled, RedisUnavailable
from dedupe.events import DEFERRED, SKIPPED, UNAVAILABLE, emit
from dedupe.runs.run import Run, RunSpec, run_of
from dedupe.runs.runtime import Runtime, installed, runtime_of
from dedupe.surfaces import AnyTask
from dedupe.values.header import KeyHeader
from dedupe.values.latest import unpack_arguments
from dedupe.values.record import Holder, pack_queued
from dedupe.values.timing import milliseconds

from . import limited_runs
from .deferral import DEFERRALS, SINCE, backoff, deferrals_of, since_of
from .run_start import take_ended_already
from .send_again import send_again

__all__ = ["guard", "refuse_uninstalled"]

logger = logging.getLogger("dedupe.worker")


def refuse_uninstalled(task: AnyTask, task_id: str) -> None:
    """Fail a guarded task's run in a worker whose app ``dedupe.install`` was never called
    for, loudly and with the fix, after freeing its message's key: without install no
    claim, no release and no guard runs, and the key would name a finished task for its
    whole ttl."""
    app = task.app
    if installed(app) is not None or task.request.is_eager:
        return  # (eager: the caller's own process, no message, no key)
    header = KeyHeader.read(getattr(task.request, "headers", None))
    outcome = "it carried no key"
    if header is not None:
        try:
            _bare_runtime(app).store.cancel(header.keys, task_id)
            outcome = f"its key {header.keys.call} is freed"
        except DedupeError as exc:
            outcome = f"its key {header.keys.call} could not be freed ({exc}): its ttl frees it"
    error = NotInstalled(str(app.main))
    logger.error("%s[%s] is refused, and %s: %s", task.name, task_id, outcome, error)
    raise error


# Only to free the keys of refused runs: settings and a Redis client, no signal handlers.
_bare_runtimes: weakref.WeakKeyDictionary[Celery, Runtime] = weakref.WeakKeyDictionary()


def _bare_runtime(app: Celery) -> Runtime:
    runtime = _bare_runtimes.get(app)
    if runtime is None:
        runtime = _bare_runtimes[app] = Runtime(app)
    return runtime


def guard(task: AnyTask, task_id: str) -> None:
    """Stop a run whose key another run holds: skip it (Ignore) or try it again later."""
    request = task.request
    ended = take_ended_already(request)
    if ended is not None:
        _skip_ended(task, task_id, ended)
    limited_runs.wait_turn(task, request)
    run = run_of(request)
    if run is not None and run.verdict == "early":
        _go_again_at_deadline(task, request, run)
    if run is None or run.verdict != "held":
        return
    holder = run.holder
    assert holder is not None
    spec = run.spec
    if (
        spec.until != "finished"
        or spec.canvas
        or spec.carried
        or spec.on_running == "retry"
        or holder.task_id == task_id
    ):
        # Retrying is the only safe move for these: a started- or window-mode call must run
        # after the current run, a canvas member must not cut its workflow, a message the producer
        # accepted may be some caller's holder (a skip would leave its .get() hanging), and
        # a copy of the holder's own task id may be the only copy left if the holder died.
        # Each deferral of a message waits twice as long as the one before, up to the cap,
        # and a message gives up after max_deferrals (a holder that never lets go).
        key = spec.keys.run
        config = runtime_of(task.app).config
        headers = getattr(request, "headers", None)
        deferrals = deferrals_of(headers)
        if deferrals < config.max_deferrals:
            countdown = backoff(spec.running_countdown, deferrals, config.deferral_cap)
            deferral = deferrals + 1
            since = since_of(headers) or time.time()
            emit(DEFERRED, task.name, task_id, key, holder, countdown=countdown, deferral=deferral)
            if spec.until != "window" and spec.carried and holder.task_id != task_id:
                _wait_in_line(runtime_of(task.app), task.name, task_id, spec, since)
            _defer(task, request, countdown, deferral, since)
        logger.warning(
            "%s[%s] gives up after %d deferrals: %s is still %s (dedupe_max_deferrals)",
            task.name,
            task_id,
            deferrals,
            holder.task_id,
            holder.state,
        )
        _free_given_up(runtime_of(task.app), task.name, task_id, spec)
        reason = f"gave up after {deferrals} deferrals (dedupe_max_deferrals)"
    else:
        reason = "on_running='skip'"
    held_by = f"{holder.task_id} is {holder.state}"
    emit(SKIPPED, task.name, task_id, spec.keys.run, holder, reason=held_by)
    _store_skipped(task, request, task_id, holder, reason)
    raise Ignore()


def _skip_ended(task: AnyTask, task_id: str, key: str) -> NoReturn:
    # The broker delivered again the message of a run that ended (a broker cut or a killed
    # worker lost its ack): running it would be the burst's second run, with its message's
    # own arguments, the burst's first call's. Its result is the ended run's (kept: nothing
    # is stored); Ignore acks the message. A claim it made is released as it ends.
    reason = "its run ended already (the message was delivered again)"
    emit(SKIPPED, task.name, task_id, key, None, reason=reason)
    raise Ignore()


def _go_again_at_deadline(task: AnyTask, request: Context, run: Run) -> NoReturn:
    # A debounced message that came before its burst's deadline: the same task id is sent
    # again for the deadline, with the latest arguments (its key goes back to queued for it,
    # as for a retry), and this delivery ends as RETRY. A retry from the body is not counted.
    latest = run.latest
    assert latest is not None
    request.args, request.kwargs = unpack_arguments(latest.body, task.app.conf.accept_content)
    countdown = max(latest.deadline - time.time(), 0.0)
    signature = task.signature_from_request(request, countdown=countdown)
    logger.debug("%s[%s] is early: sent again in %.3f s", task.name, request.id, countdown)
    send_again(task, request, signature, countdown)


def _wait_in_line(
    runtime: Runtime, task_name: str, task_id: str, spec: RunSpec, since: float
) -> None:
    # A message the producer accepted, held off by another task id: its own record is gone
    # (a Redis restart or failover lost it), or that task could not hold the key. It takes
    # its place again, so that calls made while it waits are its duplicates, not new tasks
    # that win the key before its next try (and again, and again).
    record = pack_queued(task_id, time.time(), None)
    try:
        runtime.store.wait(spec.keys, task_id, record, milliseconds(spec.ttl), since)
    except RedisUnavailable as exc:
        action = "waits without its key"
        emit(UNAVAILABLE, task_name, task_id, spec.keys.call, action=action, error=exc.cause)


def _free_given_up(runtime: Runtime, task_name: str, task_id: str, spec: RunSpec) -> None:
    # A message that gives up never runs: its queued record (started mode: a call accepted
    # during a run; or a call waiting in a run's record) would answer calls for its ttl with a
    # task that is over. A throttle window's record stays: it is the window.
    if spec.until == "window":
        return
    try:
        runtime.store.cancel(spec.keys, task_id)
    except RedisUnavailable as exc:
        action = "gave up and its key was not freed (its ttl frees it)"
        emit(UNAVAILABLE, task_name, task_id, spec.keys.call, action=action, error=exc.cause)


def _store_skipped(task: AnyTask, request: Context, task_id: str, holder: Holder, why: str) -> None:
    # A skip stores its end, so the caller's .get() raises (TaskRevokedError naming the
    # holder) instead of waiting on PENDING forever.
    if request.ignore_result or getattr(task, "ignore_result", False):
        return
    reason = f"skipped: {task.name}[{holder.task_id}] is {holder.state} with the same key ({why})"
    try:
        task.backend.mark_as_revoked(task_id, reason, request=request)
    except Exception as exc:  # a result store that fails is no reason to run the task
        logger.warning(
            "%s[%s] skipped; its result could not be stored: %r", task.name, task_id, exc
        )


def _defer(
    task: AnyTask, request: Context, countdown: float, deferral: int, since: float
) -> NoReturn:
    # Like task.retry(), but a deferral does not count as a retry: the task's own
    # max_retries is left for its own failures. The message counts its deferrals itself.
    signature = task.signature_from_request(request, countdown=countdown)
    headers = signature.options.get("headers") or {}
    signature.options["headers"] = {**headers, DEFERRALS: deferral, SINCE: since}
    send_again(task, request, signature, countdown)
