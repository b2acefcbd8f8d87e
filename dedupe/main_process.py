"""The worker's main process: keys of runs it lost, revoked or is killing, and continuations
it sends (retry_on_worker_lost), or that tasks of other bases send (their retries).

These handlers act for "any run" of a task id only when the run in the record is known
dead or being killed by this process (run.main_process_token): a live copy of the task,
in another child or on another host, is never touched.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from celery.exceptions import TimeLimitExceeded

from .errors import DedupeError, RedisUnavailable
from .options import UniqueOptions
from .plan import keys_for, options_for
from .run import RunSpec, carried_by, is_publishing, main_process_token, run_of
from .runtime import Runtime, installed
from .worker import requeue_run, run_spec, seconds_until, spec_of

__all__ = ["on_before_publish", "on_failure", "on_revoked"]

logger = logging.getLogger("dedupe.worker")


def _in_run() -> bool:
    from celery._state import get_current_worker_task

    return get_current_worker_task() is not None


def on_failure(
    sender: Any = None,
    task_id: str = "",
    exception: Any = None,
    args: Any = None,
    kwargs: Any = None,
    **_: Any,
) -> None:
    # In the process that ran the task, task_postrun follows and handles it. Here: the
    # prefork parent, after a killed child or a hard time limit. A lost child's message is
    # not redelivered (else Celery sends no task_failure), so the key goes; a hard time
    # limit under acks_late (acks_on_timeout off) requeues the message, and the key with it.
    if sender is None or _in_run():
        return
    timed_out = isinstance(exception, TimeLimitExceeded)
    requeue = timed_out and bool(sender.acks_late) and not _acks_on_timeout(sender)
    _from_main_process(sender, task_id, args, kwargs, requeue=requeue, killing=timed_out)


def on_revoked(sender: Any = None, request: Any = None, terminated: bool = False, **_: Any) -> None:
    if sender is None or request is None:
        return
    _from_main_process(
        sender, request.id, request.args, request.kwargs, request, killing=bool(terminated)
    )


def on_before_publish(sender: Any = None, headers: Any = None, **_: Any) -> None:
    """Put a continuation's key back to queued before its message exists.

    Continuations that the producer guard publishes (every DedupeTask call) are handled
    there. This catches the others: a retry of a task of another base class that was sent
    through dedupe.apply_async, in its run, and retry_on_worker_lost in the worker's main
    process. Before the publish, not after: the new message may start at once elsewhere.
    """
    if is_publishing() or not headers:
        return
    carried = carried_by(headers)
    task_id = headers.get("id")
    if carried is None or not task_id:
        return
    from celery._state import get_current_app, get_current_worker_task

    current = get_current_worker_task()
    if current is not None:
        if current.request.id != task_id:
            return  # a new call made from inside some run, with copied headers
        run = run_of(current.request)
        if run is None or run.verdict == "held" or run.requeued or run.spec.keys != carried.keys:
            return
        runtime, token = installed(current.app), run.token if run.verdict == "claimed" else ""
        if run.lease is not None and runtime is not None:
            runtime.heartbeat.drop(run.lease)
            run.lease = None
        run.requeued = True
    else:
        runtime = installed(get_current_app())
        if runtime is None:
            return
        token = main_process_token(runtime.store, carried.keys)
    if runtime is None:
        return
    delay = seconds_until(_parse_eta(headers.get("eta")))
    ttl = carried.ttl if carried.ttl is not None else runtime.config.default_ttl
    spec = spec_of(carried.keys, carried.until, ttl, UniqueOptions(), False)
    try:
        requeue_run(runtime, spec, task_id, token, delay)
    except RedisUnavailable as exc:
        logger.warning("could not requeue the key of %s: %s", task_id, exc.cause)


def _parse_eta(eta: Any) -> Any:
    if isinstance(eta, str):
        try:
            return dt.datetime.fromisoformat(eta)
        except ValueError:
            return None
    return eta


def _acks_on_timeout(task: Any) -> bool:
    value = getattr(task, "acks_on_timeout", None)
    if value is None:
        value = getattr(task, "acks_on_failure_or_timeout", True)
    return bool(value)


def _from_main_process(
    task: Any,
    task_id: str,
    args: Any,
    kwargs: Any,
    request: Any = None,
    *,
    requeue: bool = False,
    killing: bool = False,
) -> None:
    """Release (or requeue) a task id's key from the worker's main process, for the run
    that it lost, revoked or is killing: never over a copy of the task that still runs."""
    runtime = installed(task.app)
    if runtime is None or not task_id:
        return
    spec = _main_process_spec(runtime, task, args, kwargs, request, task_id)
    if spec is None:
        return
    try:
        token = main_process_token(runtime.store, spec.keys, killing=killing)
        if requeue:
            requeue_run(runtime, spec, task_id, token, 0.0)
        else:
            runtime.store.release(spec.keys, task_id, token)
    except RedisUnavailable as exc:
        logger.warning(
            "could not free the key of %s[%s] (its lease will): %s", task.name, task_id, exc.cause
        )


def _main_process_spec(
    runtime: Runtime,
    task: Any,
    args: Any,
    kwargs: Any,
    request: Any = None,
    task_id: str | None = None,
) -> RunSpec | None:
    if request is None:
        # task_failure after a lost child pushes the request; a hard time limit does not.
        current = task.request
        request = current if task_id is not None and current.id == task_id else None
    try:
        if request is not None:
            return run_spec(runtime, task, request, args or (), kwargs or {})
        if getattr(task, "unique", False) or getattr(task, "exclusive", False):
            options = options_for(task, task.name, runtime.config)
            keys = keys_for(runtime, task, task.name, options, args or (), kwargs or {})
            return spec_of(keys, options.until, options.ttl, options, False)
    except DedupeError as exc:
        logger.error("cannot find the key of %s[%s]: %s", task.name, task_id, exc)
    return None
