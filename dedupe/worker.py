"""Worker side: claim the key when a run starts, release it on every way a run can end.

Where each ending is seen (``after_return`` misses most of them):

============================================  ==============================================
ending                                        handler
============================================  ==============================================
success, failure, Ignore, Reject, soft limit  ``task_postrun``, in the process that ran it
retry (DedupeTask)                            its ``apply_async``, before the message exists
retry (other bases), retry_on_worker_lost     ``before_task_publish``, before the message
killed child, hard time limit                 ``task_failure`` in the prefork parent
revoked (before start or terminated), expiry  ``task_revoked`` in the prefork parent
anything else (a whole worker killed)         the lease, then the ttl
============================================  ==============================================

The main process's handlers live in dedupe/main_process.py. Handlers are idempotent (a hard
time limit reports its failure twice) and owner-checked: a run releases only what its own
task id and run token hold.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
from typing import Any, NoReturn, cast

from celery import Task, signals, states
from celery.exceptions import Ignore, Retry

from .checks import eviction_risk
from .errors import KeyDerivationError, RedisUnavailable
from .keys import CallKeys
from .options import UniqueOptions
from .plan import keys_for, options_for
from .record import pack_queued, pack_running
from .run import (
    NO_RUN,
    Run,
    RunSpec,
    attach,
    carried_by,
    detach,
    new_token,
    run_of,
)
from .runtime import Runtime, installed
from .store import Lease

__all__ = ["connect_signals", "guard", "requeue_run", "run_spec", "seconds_until", "spec_of"]

logger = logging.getLogger("dedupe.worker")

_HOST = socket.gethostname()
_connected = False
_connect_lock = threading.Lock()


def connect_signals() -> None:
    """Connect the lifecycle handlers, once per process (they serve every installed app)."""
    # The main process's handlers use this module's helpers: import them here, not above.
    from .main_process import on_before_publish, on_failure, on_revoked

    global _connected
    with _connect_lock:
        if _connected:
            return
        signals.task_prerun.connect(_on_prerun, weak=False, dispatch_uid="dedupe.prerun")
        signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="dedupe.postrun")
        signals.task_failure.connect(on_failure, weak=False, dispatch_uid="dedupe.failure")
        signals.before_task_publish.connect(
            on_before_publish, weak=False, dispatch_uid="dedupe.before_publish"
        )
        signals.task_revoked.connect(on_revoked, weak=False, dispatch_uid="dedupe.revoked")
        signals.worker_ready.connect(_on_worker_ready, weak=False, dispatch_uid="dedupe.ready")
        _connected = True


def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    runtime = installed(app)
    if runtime is None:
        return
    warning = eviction_risk(runtime.store.client)
    if warning:
        logger.warning(warning)


# -- where the run's spec comes from ---------------------------------------------------------


def run_spec(runtime: Runtime, task: Any, request: Any, args: Any, kwargs: Any) -> RunSpec | None:
    """The spec of a run: from the message header (``request.headers``, not an attribute:
    in eager mode only the dict has it), or derived for a guarded task's message that
    bypassed the producer path (send_task, sent before install)."""
    carried = carried_by(getattr(request, "headers", None))
    options = options_for(task, task.name, runtime.config)
    canvas = bool(
        request.chain or request.callbacks or request.errbacks or request.chord or request.group
    )
    if carried is not None:
        ttl = carried.ttl if carried.ttl is not None else options.ttl
        return spec_of(carried.keys, carried.until, ttl, options, canvas, carried=True)
    if not (getattr(task, "unique", False) or getattr(task, "exclusive", False)):
        return None
    keys = keys_for(runtime, task, task.name, options, args, kwargs)
    return spec_of(keys, options.until, options.ttl, options, canvas)


def spec_of(
    keys: CallKeys,
    until: Any,
    ttl: float,
    options: UniqueOptions,
    canvas: bool,
    *,
    carried: bool = False,
) -> RunSpec:
    return RunSpec(
        keys=keys,
        until="started" if until == "started" else "finished",
        ttl=ttl,
        lease=options.lease,
        on_running=options.on_running,
        running_countdown=options.running_countdown,
        canvas=canvas,
        carried=carried,
    )


# -- the run's start ---------------------------------------------------------------------------


def _on_prerun(
    sender: Any = None,
    task_id: str = "",
    task: Any = None,
    args: Any = None,
    kwargs: Any = None,
    **_: Any,
) -> None:
    task = task or sender
    runtime = installed(task.app)
    request = task.request
    if runtime is None or request.is_eager or request.called_directly:
        return
    try:
        spec = run_spec(runtime, task, request, args or (), kwargs or {})
    except KeyDerivationError as exc:
        logger.error("%s[%s] runs unguarded: %s", task.name, task_id, exc)
        return
    if spec is None:
        return
    attach(request, _claim(runtime, task, task_id, spec))


def _claim(runtime: Runtime, task: Any, task_id: str, spec: RunSpec) -> Run:
    token = new_token()
    lease_ms = _ms(spec.lease)
    pid = os.getpid()
    now = time.time()
    try:
        holder = runtime.store.claim(spec.keys, task_id, token, lease_ms, _HOST, pid, int(now))
    except RedisUnavailable as exc:
        # The message is consumed already: running it beats losing it.
        logger.warning(
            "%s[%s] runs unguarded, dedup Redis unavailable: %s", task.name, task_id, exc.cause
        )
        return Run(spec, token, "error")
    if holder is not None:
        if not isinstance(task, _guarding_base()):
            logger.warning(
                "%s[%s] runs while %s holds its key: only tasks with base=dedupe.DedupeTask "
                "are kept from running concurrently",
                task.name,
                task_id,
                holder.task_id,
            )
        return Run(spec, token, "held", holder=holder)
    lease = Lease(
        spec.keys.run, task_id, token, lease_ms, pack_running(task_id, token, _HOST, pid, now)
    )
    runtime.heartbeat.hold(lease)
    return Run(spec, token, "claimed", lease=lease)


def _guarding_base() -> type:
    from .task import DedupeTask

    return DedupeTask


def guard(task: Task[Any, Any], task_id: str) -> None:
    """Stop a run whose key another run holds: skip it (Ignore) or try it again later."""
    request = task.request
    run = run_of(request)
    if run is None or run.verdict != "held":
        return
    holder = run.holder
    assert holder is not None
    spec = run.spec
    if (
        spec.until == "started"
        or spec.canvas
        or spec.carried
        or spec.on_running == "retry"
        or holder.task_id == task_id
    ):
        # Retrying is the only safe move for these: a started-mode call must run after the
        # current run, a canvas member must not cut its workflow, a message the producer
        # accepted may be some caller's holder (a skip would leave its .get() hanging), and
        # a copy of the holder's own task id may be the only copy left if the holder died.
        logger.info(
            "%s[%s] waits: %s is %s (tries again in %.0fs)",
            task.name,
            task_id,
            holder.task_id,
            holder.state,
            spec.running_countdown,
        )
        _defer(task, request, spec.running_countdown)
    logger.info("%s[%s] skipped: %s is %s", task.name, task_id, holder.task_id, holder.state)
    raise Ignore()


def _defer(task: Task[Any, Any], request: Any, countdown: float) -> NoReturn:
    # Like task.retry(), but a deferral does not count as a retry: the task's own
    # max_retries is left for its own failures.
    signature = task.signature_from_request(request, countdown=countdown)
    signature.apply_async()
    # (celery-types wants numbers.Real for `when`, which a float is but mypy cannot see.)
    raise Retry(when=cast("Any", countdown), sig=signature)


# -- the run's end -------------------------------------------------------------------------------


def _on_postrun(
    sender: Any = None,
    task_id: str = "",
    task: Any = None,
    retval: Any = None,
    state: str | None = None,
    **_: Any,
) -> None:
    task = task or sender
    run = detach(task.request)
    runtime = installed(task.app)
    if run is None or runtime is None:
        return
    if run.lease is not None:
        runtime.heartbeat.drop(run.lease)
    if run.verdict == "held":
        return  # never touch the holder's record
    # A run whose claim failed (Redis was unreachable) holds no run: it speaks for its
    # queued record only, never for a copy of its task id that claimed since.
    token = run.token if run.verdict == "claimed" else NO_RUN
    spec = run.spec
    try:
        if run.requeued:
            # A continuation (retry, replace) put the key back to queued before its message
            # was published; that message owns it now. A RETRY without one (a bare
            # `raise Retry()` publishes nothing) falls through to the release.
            return
        if state == states.REJECTED and getattr(retval, "requeue", False) and task.acks_late:
            # The message goes back to the queue, and the record with it. (Without
            # acks_late the message was acked already: a requeue loses it.)
            requeue_run(runtime, spec, task_id, token, 0.0)
        elif run.verdict == "claimed":
            runtime.store.release_soon(spec.keys, task_id, token)
        else:
            runtime.store.cancel(spec.keys, task_id)
    except RedisUnavailable as exc:
        logger.warning(
            "could not free the key of %s[%s] (its lease will): %s", task.name, task_id, exc.cause
        )


def requeue_run(runtime: Runtime, spec: RunSpec, task_id: str, token: str, delay: float) -> None:
    now = time.time()
    record = pack_queued(task_id, now, now + delay if delay else None)
    runtime.store.requeue(spec.keys, task_id, token, record, _ms(spec.ttl + delay))


def seconds_until(when: Any) -> float:
    if isinstance(when, (int, float)):
        return max(float(when), 0.0)
    if isinstance(when, dt.datetime):
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.timezone.utc)
        return max(float(when.timestamp()) - time.time(), 0.0)
    return 0.0


def _ms(seconds: float) -> int:
    return max(int(seconds * 1000), 1)
