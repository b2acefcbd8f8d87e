"""Flow control per key at the call: a call of a task with ``key_concurrency`` takes its
place in its key's line; a call of a task with ``key_rate_limit`` reserves the next free
start of its key, published with the eta of it. A place in line, a start, or both, go with
the message in one round trip on a Redis broker that is the dedup store's server and db (a
start's script writes the message's eta); else one round trip to the dedup Redis, then the
publish. Every call is accepted: nothing here refuses or deduplicates.

The entry points that deduplicate other tasks' calls (``dedupe.apply_many``,
``aapply_many``, ``aapply_async``) publish each limited call as its ``delay`` does, in call
order, each in its own round trip (:func:`publish_limited_many`, :func:`apublish_limited`).

The run side (a slot, or a start checked again) is :mod:`dedupe.worker.limited_runs`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from dedupe.brokers.plans import LinePlan, StartPlan
from dedupe.errors import ConfigurationError, RedisUnavailable
from dedupe.events import UNAVAILABLE, emit
from dedupe.runs.runtime import Runtime, runtime_of
from dedupe.store.commands.starts import PlaceWait
from dedupe.values.config import SettingReader
from dedupe.values.header import publishing
from dedupe.values.key_derivation import keys_for
from dedupe.values.keys import limited_names_key
from dedupe.values.limits import LIMIT, LimitHeader
from dedupe.values.options import UniqueOptions, limit_header, options_for, pop_call_options
from dedupe.values.timing import delay_seconds, milliseconds, seconds_to_expiry

from .call import Call, CallOptions, new_task_id, producer_block
from .call_sender import sender_for
from .result import DedupeResult, mark_result

__all__ = ["apublish_limited", "is_limited", "publish_limited", "publish_limited_many"]

logger = logging.getLogger("dedupe.producer")

_always_eager = SettingReader("task_always_eager")
_enable_utc = SettingReader("enable_utc")
_task_protocol = SettingReader("task_protocol")


def publish_limited(call: Call) -> DedupeResult:
    """Publish a call of a limited task: its start reserved (rate), its place in line taken
    (concurrency), its message sent carrying its key and limits for its run."""
    app, options = call.app, call.options
    # A call may name its key's arguments (unique_on, unique_key); the options of dedup are
    # refused by options_for, as on the task.
    overrides = pop_call_options(options)
    task_id = options.get("task_id")
    current = app.current_worker_task
    if _always_eager(app) or (
        task_id is not None and current is not None and current.request.id == task_id
    ):
        # Eager: nothing to limit. The same task id sent again from its own run (a run
        # that waits its turn, a retry): its message carries its header, and its run asks.
        return mark_result(call.publish(call.args, call.kwargs, options), deduplicated=False)
    if call.task is None:
        return _published_by_name(call, overrides, options)
    runtime = runtime_of(app)
    unique = options_for(call.task, call.task_name, runtime.config, overrides)
    keys = keys_for(
        runtime.config.key_prefix, call.task, call.task_name, unique, call.args, call.kwargs
    )
    if not task_id:
        task_id = options["task_id"] = new_task_id()
    now = time.time()
    countdown, eta = options.get("countdown"), options.get("eta")
    delay = (
        delay_seconds(countdown, eta, now, enable_utc=_enable_utc(app)) if countdown or eta else 0.0
    )
    rate = unique.rate
    header = limit_header(unique, keys.call, call.task_name, call.args, call.kwargs)
    earliest_ms = milliseconds(delay) if delay else 0
    if rate is not None:
        # (Protocol 2: the eta a script writes is a header's, outside the message body.)
        in_one_step = runtime.one_step and _task_protocol(app) == 2
        start = StartPlan(
            lambda: runtime.store,
            header.keys,
            task_id,
            rate.count,
            milliseconds(rate.period),
            earliest_ms,
            _on_unavailable(runtime, call.task_name, task_id, keys.call),
            # With both limits, the place goes with the start in one step; else after it.
            # (A lease past its start: a place whose message is lost never holds the line
            # longer; a message later than that takes a place at the back as it comes.)
            _place_wait(call, unique.lease, now) if in_one_step and header.holds_slots else None,
        )
        if in_one_step:
            return _publish_in_line(runtime, call, header, start)
        try:
            # The start first: its countdown is in the message, and a place waits as long.
            delay_ms = start.reserve_apart()
            if delay_ms != earliest_ms:
                options.pop("eta", None)
                options["countdown"] = delay = delay_ms / 1000
            return _publish_apart(runtime, call, header, unique, now, delay)
        except BaseException:
            start.leave_apart()
            raise
    return _publish_apart(runtime, call, header, unique, now, delay)


def _publish_apart(
    runtime: Runtime,
    call: Call,
    header: LimitHeader,
    unique: UniqueOptions,
    now: float,
    delay: float,
) -> DedupeResult:
    """Publish a limited call whose start, if it has a rate, is reserved already: its place in
    line taken with its message in one step where the broker allows, else apart from it."""
    task_id = str(call.options["task_id"])
    if not header.holds_slots:
        return _publish_with(call, header)
    if header.kind == "concurrency":
        return _publish_concurrency(runtime, call, header, unique.ttl, unique.lease, delay)
    place_ms = _place_wait(call, unique.lease, now).ms_after(milliseconds(delay) if delay else 0)
    unavailable = _on_unavailable(runtime, call.task_name, task_id, header.key)
    line = LinePlan(lambda: runtime.store, header.keys, task_id, place_ms, unavailable)
    if runtime.one_step:
        return _publish_in_line(runtime, call, header, line)
    return _publish_with(call, header, place=line)


def _publish_concurrency(
    runtime: Runtime, call: Call, header: LimitHeader, ttl: float, lease: float, delay: float
) -> DedupeResult:
    """A call with ``key_concurrency`` alone: on a Redis broker that is the dedup store, handed
    a free slot with its message, or held in line with it, in one round trip
    (hold_or_push.lua); else (or not due yet: an eta, a countdown) published as it is, and
    its run takes its turn as it comes (turn.lua): no place before its message exists."""
    task_id = str(call.options["task_id"])
    unavailable = _on_unavailable(runtime, call.task_name, task_id, header.key)
    if delay:
        return _publish_with(call, header)
    if not runtime.one_step:
        # Its place first, for call order: it lapses a lease on if its message never comes
        # (a process killed before its publish), so it never holds the line longer.
        place = LinePlan(
            lambda: runtime.store, header.keys, task_id, milliseconds(lease), unavailable
        )
        return _publish_with(call, header, place=place)
    line = LinePlan(
        lambda: runtime.store,
        header.keys,
        task_id,
        milliseconds(ttl),
        unavailable,
        limit=header.limit,
        lease_ms=milliseconds(lease),
    )
    result = _publish_in_line(runtime, call, header, line)
    if line.ahead:
        logger.info(
            "%s[%s] waits its turn in the line of %s (limit %d): number %d, held in Redis",
            call.task_name,
            task_id,
            header.key,
            header.limit,
            line.ahead,
        )
    return result


def _publish_with(
    call: Call, header: LimitHeader, *, place: LinePlan | None = None
) -> DedupeResult:
    """Publish a limited call (its start reserved already, if it has a rate), its ``place``
    in line taken first, apart from it (None: none to take)."""
    try:
        if place is not None:
            place.take_place_apart()
        _add_header(call.options, header)
        with publishing():
            sent = call.publish(call.args, call.kwargs, call.options)
    except BaseException:
        # No message, or none known: whatever cut the take short too. (A start reserved
        # apart goes back in publish_limited.)
        if place is not None:
            place.leave_apart()
        raise
    return mark_result(sent, deduplicated=False)


def _publish_in_line(
    runtime: Runtime, call: Call, header: LimitHeader, plan: LinePlan | StartPlan
) -> DedupeResult:
    """Publish a limited call on a Redis broker that is the dedup store: its place in line
    (ticket_publish.lua), or its start (start_publish.lua), or both
    (start_ticket_publish.lua) taken with its message, in one round trip."""
    options = call.options
    _add_header(options, header)
    # The producer first: the seam is installed on its channel.
    with producer_block(call) as producer:
        options["producer"] = producer
        try:
            with runtime.broker.pushing_in_line(producer, plan), publishing():
                sent = (sender_for(call, producer) or call.publish)(call.args, call.kwargs, options)
        except BaseException:
            # (Only what was taken apart from its push goes, where one script could not push
            # it: once its script is sent, all of it and the message are there or none.)
            plan.leave_apart()
            raise
    return mark_result(sent, deduplicated=False)


def _add_header(options: CallOptions, header: LimitHeader) -> None:
    headers = dict(options.get("headers") or {})
    headers[LIMIT] = header.encode()
    options["headers"] = headers


def _on_unavailable(
    runtime: Runtime, task_name: str, task_id: str, key: str
) -> Callable[[RedisUnavailable], None]:
    """What a call does when its place or its start cannot be had: raises, or (the policy
    says so) says it publishes without them."""

    def unavailable(exc: RedisUnavailable) -> None:
        if runtime.config.on_redis_error == "raise":
            raise exc
        # Published all the same: its run asks again (a run without a place joins the back
        # of the line; a start is checked at the run either way).
        action = "is published without its place in line (its run asks for one)"
        emit(UNAVAILABLE, task_name, task_id, key, action=action, error=exc.cause)

    return unavailable


def _place_wait(call: Call, ttl: float, now: float) -> PlaceWait:
    """How long a call's place in line waits for its message's first run: ``ttl`` (a lease)
    past its countdown, or until the message expires (an expired message never runs, and a
    place nobody takes holds the line)."""
    expiry = _expiry_of(call, now)
    return PlaceWait(milliseconds(ttl), None if expiry is None else milliseconds(expiry))


def _expiry_of(call: Call, now: float) -> float | None:
    """Seconds from ``now`` until the call's message expires (None: never)."""
    expires = call.options.get("expires", getattr(call.task, "expires", None))
    if expires is None:
        return None
    return seconds_to_expiry(expires, now, enable_utc=_enable_utc(call.app))


_always_eager = SettingReader("task_always_eager")

# Calls in flight: asyncio keeps only weak references to tasks.
_in_flight: set[asyncio.Future[DedupeResult]] = set()


def _published_by_name(
    call: Call, overrides: Mapping[str, object] | None, options: CallOptions
) -> DedupeResult:
    # A limited task this process does not import: its worker knows the limit and gives
    # the message its turn as it comes (no place at the call: the call order is the
    # arrival order). Its key is the task's own: a call cannot name another.
    if overrides:
        raise ConfigurationError(
            f"task {call.task_name!r} is limited (key_concurrency or key_rate_limit) and this "
            f"process does not import it: its calls by name cannot set "
            f"{', '.join(sorted(overrides))}; declare them on the task, or import it here"
        )
    return mark_result(call.publish(call.args, call.kwargs, options), deduplicated=False)


def is_limited(call: Call) -> bool:
    """Is ``call`` of a task with ``key_concurrency`` or ``key_rate_limit``? (A task's
    declaration says so: no call option makes a call limited. For a name this process does
    not import, the workers' word: :mod:`dedupe.runs.limited_names`.)"""
    if _always_eager(call.app):
        return False  # (nothing to limit, nor to deduplicate: the guard runs it)
    runtime = runtime_of(call.app)
    if call.task is None:
        return _named_limited(runtime, call.task_name)
    return options_for(call.task, call.task_name, runtime.config).limited


#: Seconds a process keeps the workers' word on a task name.
_NAMED_FOR = 10.0

# (dedup Redis, prefix, task name) -> (limited?, until when it is believed; monotonic).
_named: dict[tuple[str, str, str], tuple[bool, float]] = {}


def _named_limited(runtime: Runtime, name: str) -> bool:
    # One read per name every few seconds; with the dedup Redis away, a name is taken for
    # an unlimited one (the call is then deduplicated, as before the workers named it).
    prefix = runtime.config.key_prefix
    now = time.monotonic()
    where = (runtime.config.redis_url, prefix, name)
    known = _named.get(where)
    if known is not None and known[1] > now:
        return known[0]
    try:
        limited = runtime.store.is_named_limited(limited_names_key(prefix), name)
    except RedisUnavailable:
        return False
    _named[where] = (limited, now + _NAMED_FOR)
    return limited


def publish_limited_many(calls: Sequence[Call]) -> list[DedupeResult]:
    """Publish each call of a limited task, in call order. A call whose publish raises
    leaves its place (as its ``delay`` would) and the error is raised: the calls after it
    are not made."""
    return [publish_limited(call) for call in calls]


async def apublish_limited(call: Call) -> DedupeResult:
    """:func:`publish_limited`, awaitable: in the loop's default
    executor (its round trip and kombu block), shielded from the caller's cancellation
    (cancelled between its place and its publish, a call would hold its key's line until
    its place lapses)."""
    published = asyncio.ensure_future(asyncio.to_thread(publish_limited, call))
    _in_flight.add(published)
    published.add_done_callback(_in_flight.discard)
    return await asyncio.shield(published)
