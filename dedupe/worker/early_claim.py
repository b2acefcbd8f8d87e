"""The run's claim sent as the worker accepts its message, read as the run starts.

In Celery's solo and threads pools the thread that accepts a message runs it: Celery's own
work comes between the two (its bookkeeping, the task-started event, the trace's set-up),
and a claim sent at the first has its round trip overlap that work instead of following
it. Any other pool (prefork, gevent, eventlet, a custom one) claims as the run starts, on
the running process's or greenlet's own connection. So does a task with ``acks_late``: its
message stays with the broker until the run ends, and a claim whose run never came would
hold the key until the broker delivers it again.

A claim sent whose run never reads it (Celery could not run the message: it reports an
internal error before ``task_prerun``) is released then, or at the thread's next
acceptance; failing both, its lease frees the key, as a killed run's would.
"""

from __future__ import annotations

import logging
import threading

from celery.concurrency import solo, thread
from celery.worker.request import Request

from dedupe.errors import RedisUnavailable
from dedupe.events import UNAVAILABLE, emit
from dedupe.runs.runtime import installed, runtime_of
from dedupe.surfaces import AnyTask, TaskSurface
from dedupe.values.header import LATEST, KeyHeader
from dedupe.values.limits import LimitHeader

from .claim import RunClaim, record_ttl_ms
from .deferral import deferrals_of
from .requeue import requeue_key
from .run_spec import carried_spec

__all__ = [
    "drop_unread",
    "keep",
    "on_internal_error",
    "pool_accepts_in_place",
    "send_claim",
    "sends_at_acceptance",
    "take",
    "take_any",
]

logger = logging.getLogger("dedupe.worker")

_sent = threading.local()

#: This process's worker pool runs a message in the thread that accepted it (set as the
#: worker starts; a prefork child inherits its parent's False).
_in_place = False


#: Celery's own pools that run a message where they accept it, as a worker may name them
#: (their aliases, and their paths).
_IN_PLACE = frozenset(
    {"solo", "threads", "celery.concurrency.solo:TaskPool", "celery.concurrency.thread:TaskPool"}
)


def pool_accepts_in_place(pool_cls: object) -> None:
    """Note the worker's pool (``WorkController.pool_cls``, a name or a class): only
    Celery's own solo and threads pools, exactly, run a message where they accept it.
    (A name is not imported: Celery loads the pool after ``worker_init``, so that its
    handlers may patch first, for gevent.)"""
    global _in_place
    if isinstance(pool_cls, str):
        _in_place = pool_cls in _IN_PLACE
    else:
        _in_place = pool_cls is not None and pool_cls in (solo.TaskPool, thread.TaskPool)


def sends_at_acceptance() -> bool:
    """Does this process's worker send claims as it accepts messages?"""
    return _in_place


def keep(claim: RunClaim) -> None:
    """The claim this thread sent last, for its run to read."""
    _sent.claim = claim


def take(task_id: str) -> RunClaim | None:
    """The claim this thread sent for ``task_id``, once; None if it sent none."""
    claim: RunClaim | None = getattr(_sent, "claim", None)
    if claim is None or claim.task_id != task_id:
        return None  # (another task id's stays, for take_any() to give back)
    _sent.claim = None
    return claim


def take_any() -> RunClaim | None:
    """The claim this thread sent whose run never read it, if any (once)."""
    claim: RunClaim | None = getattr(_sent, "claim", None)
    _sent.claim = None
    return claim


def send_claim(request: Request) -> None:
    """Send a run's claim as the worker accepts its message, in the thread that runs it,
    the reply read as the run starts. Only a message of the plain case, a producer's key
    and nothing else to do first; any other claims as it starts. Never raises (Celery
    would neither ack nor run the message): the run claims as it starts."""
    if not sends_at_acceptance():
        return
    unread = take_any()
    if unread is not None:
        # Its run never started, and Celery reported no end for it: its message was acked
        # as it was accepted (never acks_late here), and is gone.
        drop_unread(request.task, unread, consumed=True)
    try:
        claim = _claim_to_send(request)
    except Exception:
        logger.exception("%s[%s] claims as it starts", request.name, request.id)
        return
    if claim is None:
        return
    try:
        claim.slot = runtime_of(request.task.app).store.start_claim(
            claim.spec.keys, claim.task_id, *claim.arguments(), **claim.options()
        )
    except RedisUnavailable as exc:
        claim.error = exc  # (the run says so as it starts)
    except Exception:
        logger.exception("%s[%s] claims as it starts", request.name, request.id)
    keep(claim)


def _claim_to_send(request: Request) -> RunClaim | None:
    task = request.task
    runtime = installed(task.app)
    headers = request.request_dict
    if (
        runtime is None
        or task.acks_late
        or LimitHeader.read(headers) is not None
        or headers.get(LATEST)
        or (header := KeyHeader.read(headers)) is None
    ):
        return None
    spec = carried_spec(runtime, task, header, canvas=False)
    accepted = not deferrals_of(headers)  # (as on_prerun has it, for a carried spec)
    claim = RunClaim.of(request.id, spec, accepted, record_ttl_ms(runtime, task, spec))
    claim.name = task.name
    return claim


def on_internal_error(sender: AnyTask | None = None, task_id: str = "", **_: object) -> None:
    """``task_internal_error``: Celery could not run a message it accepted (its keyword
    arguments are not a mapping, say), before ``task_prerun``: undo the claim sent."""
    unread = take(task_id)
    if unread is not None and sender is not None:
        drop_unread(sender, unread, consumed=True)  # (acked as it was accepted)


def drop_unread(task: TaskSurface, claim: RunClaim, *, consumed: bool) -> None:
    """Undo a claim sent as its message was accepted, whose run never started (Celery ended
    the request first): released if the message is consumed (acked), else its record goes
    back to queued, for the message's next delivery. Never raises (Celery's own handling
    goes on); a claim it cannot undo is left to its lease."""
    runtime = installed(task.app)
    if runtime is None:
        return
    keys = claim.spec.keys
    try:
        if claim.slot is not None and runtime.store.claim_result(keys, claim.slot) is not None:
            return  # (held by another run: it wrote nothing)
        if consumed:
            runtime.store.release(keys, claim.task_id, claim.token)
        else:
            requeue_key(runtime, keys, claim.spec.ttl, claim.task_id, claim.token, 0.0)
    except Exception as exc:  # (Redis unreachable, or a bug: the lease frees the key)
        action = "never started, and its claim was not undone (its lease frees it)"
        emit(UNAVAILABLE, claim.name, claim.task_id, keys.run, action=action, error=exc)
        return
    logger.debug("%s[%s] never started: its claim is undone", claim.name, claim.task_id)
