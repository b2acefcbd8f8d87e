"""Flow control per key at the run: a run of a ``key_concurrency`` task runs in the slot its
message was handed (a lease, renewed by the heartbeat), or in a free one when nobody waits;
else it waits in its key's line, held in Redis with what publishes it again, and its
delivery ends (``Ignore``: no ``RETRY``, no message left in the broker). Its end frees the
slot and hands it on to the head of the line in the same round trip (:mod:`dedupe.brokers`
publishes what the script did not push). A run of a ``key_rate_limit`` task starts when fewer
than N runs of its key started in the last period; a run of a task with both takes its slot
and its start together, or neither, and one that must wait is sent again under the same task
id (its delivery ends as ``RETRY``).

The call side is :mod:`dedupe.producer.limited_publish`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn, cast

from celery.app.task import Context
from celery.exceptions import Ignore
from kombu.utils.json import dumps, loads

from dedupe.brokers.hand_off import publish_held
from dedupe.errors import RedisUnavailable
from dedupe.events import UNAVAILABLE, emit
from dedupe.runs.run import new_token
from dedupe.runs.runtime import Runtime, installed
from dedupe.store.commands.leases import Lease
from dedupe.store.commands.lines import Handed
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

#: turn.lua's verdict for the backstop of a call that waits still in its line.
_WAITS_STILL = -2


@dataclass(slots=True)
class LimitedRun:
    """A limited run, kept on its request: started (holding a slot, for concurrency), or
    told to come back in ``countdown`` seconds."""

    header: LimitHeader
    token: str
    countdown: float = 0.0
    lease: Lease | None = None
    #: Held in its key's line: the nth to get a slot (its delivery ends now).
    waits: int = 0
    #: A copy of a message that runs, ran, or waits already: dropped.
    copy: bool = False
    #: What publishes its backstop (a waiting call's copy in a broker apart from the dedup
    #: Redis, due a lease on), or "" where none is kept.
    backstop: str = ""


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
        if header.kind == "concurrency":
            _take_turn(runtime, task, task_id, run, lease_ms, milliseconds(options.ttl))
            return
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
        # (Both: one script, as a slot taken while its start is refused would hold the key
        # idle.)
        period_ms = milliseconds(header.period)
        ahead, wait_ms = store.take_slot_and_start(*slot, ttl_ms, header.starts, period_ms)
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


def _take_turn(
    runtime: Runtime, task: AnyTask, task_id: str, run: LimitedRun, lease_ms: int, ttl_ms: int
) -> None:
    # Runs in its handed slot or a free one, or waits held in line (turn.lua).
    header = run.header
    options = _held_options(task, task.request)
    # (Where the broker is apart from the dedup Redis, a waiting call keeps a copy there: a
    # loss of the dedup data loses no call.)
    backstop = not runtime.broker_is_store
    turn = runtime.store.take_turn(
        header.keys,
        task_id,
        run.token,
        lease_ms=lease_ms,
        limit=header.limit,
        ttl_ms=ttl_ms,
        options=options,
        backstop=backstop,
    )
    runtime.broker.hand_off(task.app, header.key, turn.handed)
    if turn.verdict > 0 or turn.verdict == _WAITS_STILL:
        run.waits = turn.verdict
        run.backstop = options if backstop else ""
    elif turn.verdict < 0:
        run.copy = True
    else:
        run.lease = Lease(header.keys["slots"], task_id, run.token, lease_ms, b"", slot=True)
        runtime.heartbeat.hold(run.lease, task.name)


def _held_options(task: AnyTask, request: Context) -> str:
    """What publishes this message again if it waits: its task, arguments and Celery's
    options, as a retry would send it (JSON, kept in Redis while it waits)."""
    signature = task.signature_from_request(request)
    options = {
        name: value
        for name, value in signature.options.items()
        if value is not None and name != "task_id"
    }
    held = {
        "task": task.name,
        "args": list(request.args or ()),
        "kwargs": dict(request.kwargs or {}),
        "options": options,
    }
    return str(dumps(held))


def wait_turn(task: AnyTask, request: Context) -> None:
    """``before_start``: a run that must wait is held in its line (its delivery ends), or
    sent again, same task id, for its turn (both limits, a rate). ``request``: the run's
    (``task.request``)."""
    run = limited_run_of(request)
    if run is None:
        return
    if run.waits:
        if run.waits > 0:
            logger.info(
                "%s[%s] waits its turn in the line of %s (limit %d): number %d, held in Redis",
                task.name,
                request.id,
                run.header.key,
                run.header.limit,
                run.waits,
            )
        if run.backstop:
            _send_backstop(task, request, run)
        raise Ignore()
    if run.copy:
        logger.info(
            "%s[%s] is dropped: a copy of a message of %s that runs, ran or waits already",
            task.name,
            request.id,
            run.header.key,
        )
        raise Ignore()
    if run.countdown <= 0:
        return
    _send_again(task, request, run)


def _send_backstop(task: AnyTask, request: Context, run: LimitedRun) -> None:
    # Due a lease on: back while the call still waits (sent again then), dropped once it
    # started; after a loss of the dedup data it takes a place again.
    try:
        publish_held(task.app, loads(run.backstop), cast("str", request.id), run.header.lease)
    except Exception as exc:
        logger.warning(
            "%s[%s] waits in the line of %s held in Redis only: its copy in the broker could "
            "not be sent (%r)",
            task.name,
            request.id,
            run.header.key,
            exc,
        )


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
    header = run.header
    try:
        if header.kind == "concurrency":
            # Freed and handed on in one round trip.
            _, handed = runtime.store.end_turn(
                header.keys,
                f"{task_id} {run.token}",
                lease_ms=milliseconds(header.lease),
                limit=header.limit,
            )
            runtime.broker.hand_off(task.app, header.key, handed)
        else:
            runtime.store.free_slot(header.keys, task_id, run.token)
    except RedisUnavailable as exc:
        action = "ended and its slot was not freed (its lease frees it)"
        emit(UNAVAILABLE, task.name, task_id, run.header.key, action=action, error=exc.cause)


def leave_line(task: TaskSurface, task_id: str | None, header: LimitHeader) -> None:
    """``task_revoked`` (the pool's parent) of a limited message revoked or expired before
    its run: its place in line goes now (else it would hold the calls behind it until it
    lapses)."""
    undone = "was dropped and its place in line was kept (it lapses)"
    _in_parent_hand_on(task, task_id, header, Store.leave_line, Store.leave_turn, undone)


def free_dead_slots(task: TaskSurface, task_id: str | None, header: LimitHeader) -> None:
    """``task_failure`` (the pool's parent) of a limited run whose child died: its slot is
    freed now, not a lease later."""
    undone = "was lost and its slot was not freed (its lease frees it)"
    _in_parent_hand_on(task, task_id, header, Store.free_slots_of, Store.end_turn, undone)


def _in_parent_hand_on(
    task: TaskSurface,
    task_id: str | None,
    header: LimitHeader,
    other_kinds: Callable[[Store, Mapping[str, str], str], object],
    concurrency: Callable[..., tuple[object, list[Handed]]],
    undone: str,
) -> None:
    # What the parent does for a rate (or both limits) with ``other_kinds``; for
    # key_concurrency alone, the ``concurrency`` script's freed slots are handed on.
    lease_ms = milliseconds(header.lease)

    def act(store: Store, task_id: str) -> object:
        if header.kind != "concurrency":
            return other_kinds(store, header.keys, task_id)
        _, handed = concurrency(store, header.keys, task_id, lease_ms=lease_ms, limit=header.limit)
        _hand_off(task, header, handed)
        return None

    _in_parent(task, task_id, header, act, undone)


def _hand_off(task: TaskSurface, header: LimitHeader, handed: Sequence[Handed]) -> None:
    runtime = installed(task.app)
    if runtime is not None and handed:
        runtime.broker.hand_off(task.app, header.key, handed)


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
