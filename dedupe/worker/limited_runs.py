"""Flow control per key at the run: a run of a ``key_concurrency`` task takes a slot (a
lease, renewed by the heartbeat, freed at its end or, if its worker dies, when the lease is
over) when its turn in line has come; a run of a ``key_rate_limit`` task starts when fewer
than N runs of its key started in the last period; a run of a task with both takes its slot
and its start together, or neither. A run that must wait is sent again under
the same task id (its delivery ends as ``RETRY``), for its place in line or its next start;
it is never dropped and never gives up.

The call side is :mod:`dedupe.producer.limited_publish`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, cast

from celery.app.task import Context

from dedupe.errors import RedisUnavailable
from dedupe.events import UNAVAILABLE, emit
from dedupe.runs.run import new_token
from dedupe.runs.runtime import Runtime, installed
from dedupe.store.commands.leases import Lease
from dedupe.store.store import Store
from dedupe.surfaces import AnyTask, TaskSurface
from dedupe.values.limits import LimitHeader, come_back
from dedupe.values.options import options_for
from dedupe.values.timing import milliseconds

from .send_again import send_again

__all__ = [
    "LimitedRun",
    "enter",
    "free_dead_slots",
    "leave",
    "leave_line",
    "limited_run_of",
    "wait_turn",
]

logger = logging.getLogger("dedupe.worker")

_ATTRIBUTE = "_dedupe_limited"


@dataclass(slots=True)
class LimitedRun:
    """A limited run, kept on its request: started (holding a slot, for concurrency), or
    told to come back in ``countdown`` seconds."""

    header: LimitHeader
    token: str
    countdown: float = 0.0
    lease: Lease | None = None


def limited_run_of(request: object) -> LimitedRun | None:
    run = getattr(request, _ATTRIBUTE, None)
    return run if isinstance(run, LimitedRun) else None


def enter(runtime: Runtime, task: AnyTask, task_id: str, header: LimitHeader) -> None:
    """``task_prerun`` of a limited run: ask for its slot, or check its start."""
    token = new_token()
    run = LimitedRun(header, token)
    setattr(task.request, _ATTRIBUTE, run)
    store = runtime.store
    try:
        if header.kind == "rate":
            wait_ms = store.next_start(
                header.keys, task_id, header.limit, milliseconds(header.period), token=token
            )
            run.countdown = wait_ms / 1000
            return
        options = options_for(task, task.name, runtime.config)
        turn, cap = options.running_countdown, runtime.config.deferral_cap
        lease_ms = milliseconds(header.lease)
        slot = (
            header.keys,
            task_id,
            token,
            lease_ms,
            header.limit,
            milliseconds(turn),
            milliseconds(cap),
        )
        ttl_ms = milliseconds(options.ttl)
        if header.kind == "both":
            # One script: a slot taken while its start is refused would hold the key idle.
            period_ms = milliseconds(header.period)
            ahead, wait_ms = store.take_slot_and_start(*slot, ttl_ms, header.starts, period_ms)
        else:
            wait_ms = 0
            ahead = store.take_slot(*slot, ttl_ms)
    except RedisUnavailable as exc:
        # The message is consumed already: running it beats losing it.
        action = "runs without its limit"
        emit(UNAVAILABLE, task.name, task_id, header.key, action=action, error=exc.cause)
        return
    if ahead:
        run.countdown = come_back(ahead, header.limit, turn, cap)  # (its place outlives it)
        return
    if wait_ms:
        run.countdown = wait_ms / 1000
        return
    slots = header.keys["slots"]
    run.lease = Lease(slots, task_id, token, lease_ms, b"", slot=True)
    runtime.heartbeat.hold(run.lease, task.name)


def wait_turn(task: AnyTask) -> None:
    """``before_start``: a run that must wait is sent again, same task id, for its turn."""
    request = task.request
    run = limited_run_of(request)
    if run is None or run.countdown <= 0:
        return
    _send_again(task, request, run)


def _send_again(task: AnyTask, request: Context, run: LimitedRun) -> NoReturn:
    countdown = run.countdown
    logger.info(
        "%s[%s] waits its turn (%s limit %d of %s): sent again in %.2f s",
        task.name,
        request.id,
        run.header.kind,
        run.header.limit,
        run.header.key,
        countdown,
    )
    signature = task.signature_from_request(request, countdown=countdown)
    send_again(task, request, signature, countdown)


def leave(runtime: Runtime, task: TaskSurface) -> None:
    """``task_postrun``: free the run's slot (a rate's start stays: it is a start made)."""
    request = task.request
    run = limited_run_of(request)
    setattr(request, _ATTRIBUTE, None)
    if run is None or run.lease is None:
        return
    runtime.heartbeat.drop(run.lease)
    task_id = cast("str", request.id)  # (a run's request has its id)
    try:
        runtime.store.free_slot(run.header.keys, task_id, run.token)
    except RedisUnavailable as exc:
        action = "ended and its slot was not freed (its lease frees it)"
        emit(UNAVAILABLE, task.name, task_id, run.header.key, action=action, error=exc.cause)


def leave_line(task: TaskSurface, task_id: str | None, header: LimitHeader) -> None:
    """``task_revoked`` (the pool's parent) of a limited message revoked or expired before
    its run: its place in line goes now (else it would hold the calls behind it until it
    lapses)."""
    _in_parent(
        task,
        task_id,
        header,
        lambda store, task_id: store.leave_line(header.keys, task_id),
        "was dropped and its place in line was kept (it lapses)",
    )


def free_dead_slots(task: TaskSurface, task_id: str | None, header: LimitHeader) -> None:
    """``task_failure`` (the pool's parent) of a limited run whose child died: its slot is
    freed now, not a lease later."""
    _in_parent(
        task,
        task_id,
        header,
        lambda store, task_id: store.free_slots_of(header.keys, task_id),
        "was lost and its slot was not freed (its lease frees it)",
    )


def _in_parent(
    task: TaskSurface,
    task_id: str | None,
    header: LimitHeader,
    act: Callable[[Store, str], object],
    undone: str,
) -> None:
    # The pool's parent acts for a message of its own app that holds slots (``act`` on
    # the store), or emits an event saying what was left ``undone``.
    runtime = installed(task.app)
    if runtime is None or not header.holds_slots or not task_id:
        return
    try:
        act(runtime.store, task_id)
    except RedisUnavailable as exc:
        emit(UNAVAILABLE, task.name, task_id, header.key, action=undone, error=exc.cause)
