"""What one publish must write with its message, and what became of it: the plans a broker's
publish seam carries out (:meth:`dedupe.brokers.broker.Broker.pushing_through`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from dedupe.errors import RedisUnavailable
from dedupe.store.commands.pushes import PendingPush
from dedupe.store.commands.starts import PlaceWait
from dedupe.store.replies import Push
from dedupe.store.store import Store
from dedupe.values.keys import CallKeys
from dedupe.values.latest import LatestWrite
from dedupe.values.record import Holder, pack_provisional, pack_queued
from dedupe.values.record_state import RecordState

__all__ = ["LinePlan", "PushPlan", "Refused", "StartPlan"]

logger = logging.getLogger("dedupe.producer")


class Refused(Exception):
    """The dedup script refused a publish: the call's key is held. Nothing was pushed."""

    def __init__(self, holder: Holder) -> None:
        super().__init__(holder.task_id)
        self.holder = holder


@dataclass(eq=False)
class PushPlan:
    """What one publish must write with its message, and what became of it."""

    #: The dedup store, asked for when first needed (the runtime makes it then: a Cluster
    #: no node of which answers makes none, and the call's first write says so).
    store_of: Callable[[], Store]
    keys: CallKeys
    task_id: str
    #: The call's nonce, and the fields of its queued record.
    nonce: int
    enqueued_at: float
    eta: float | None
    #: Time to live of the queued record, and of the provisional one, ms.
    ttl_ms: int
    provisional_ttl_ms: int
    #: Push even when the key is held: canvas members and continuations are never refused.
    force: bool = False
    #: What the call's record is in Redis (moved only through :meth:`RecordState.to`).
    state: RecordState = RecordState.ABSENT
    #: Hold the push back (a batch sends all of its pushes in one round trip): the seam
    #: leaves it in :attr:`pending` instead of sending it.
    deferred: bool = False
    pending: PendingPush | None = None
    #: A debounced or replacing call's: what it leaves for the holder's run as a duplicate.
    latest: LatestWrite | None = None
    #: The transport took the message (its publish returned), whatever the record is: a
    #: continuation's, which leaves the record to its run, has none of its own.
    taken: bool = False
    #: The broker's publisher confirm of the message was awaited and never came (the
    #: connection lost): queued or lost. kombu may publish it again, and return.
    unanswered: bool = False

    @property
    def store(self) -> Store:
        return self.store_of()

    def move(self, state: RecordState) -> None:
        """The record is now ``state``."""
        self.state = self.state.to(state)

    def pushed(self, outcome: Push | Holder) -> None:
        """publish.lua answered (a Holder: refused, nothing pushed)."""
        if not isinstance(outcome, Holder):
            self.move(RecordState.QUEUED)

    # Packed on first use (a duplicate needs the provisional record only, and only a publish
    # needs the queued one); plain attributes, not functools.cached_property, which takes a
    # lock on every read before Python 3.12.
    _provisional: bytes | None = None
    _queued: bytes | None = None

    @property
    def provisional(self) -> bytes:
        """This call's provisional record."""
        if self._provisional is None:
            self._provisional = pack_provisional(self.task_id, self.nonce)
        return self._provisional

    @property
    def queued(self) -> bytes:
        """This call's queued record."""
        if self._queued is None:
            self._queued = pack_queued(self.task_id, self.enqueued_at, self.eta, self.nonce)
        return self._queued


@dataclass(eq=False)
class LinePlan:
    """What the publish of a call with ``key_concurrency`` writes with its message: its
    place in its key's line (ticket.lua), and what became of it."""

    store_of: Callable[[], Store]
    #: The key's line, due and seq keys (:class:`~dedupe.values.limits.LimitHeader`'s).
    keys: Mapping[str, str]
    task_id: str
    #: How long the place waits for its message's first run, ms.
    ttl_ms: int
    #: Called when a place taken apart from the push cannot be had (Redis unreachable):
    #: raises to refuse the publish, or returns to publish without the place.
    unavailable: Callable[[RedisUnavailable], None]
    #: absent: nothing written; sent: ticket_publish.lua was sent (the place and the message
    #: both, or neither); placed: the place taken apart (or asked for: its fate unknown), its
    #: message not pushed yet; pushed: the place and its message; dropped: routed nowhere, so
    #: no place either.
    state: Literal["absent", "sent", "placed", "pushed", "dropped"] = "absent"
    #: key_concurrency alone (hold_or_push.lua): the key's limit and a handed slot's lease,
    #: ms; 0: a place in line only (ticket_publish.lua, with key_rate_limit too).
    limit: int = 0
    lease_ms: int = 0
    #: Held in line (hold_or_push.lua's answer): the nth to get a slot; 0: pushed now.
    ahead: int = 0

    @property
    def store(self) -> Store:
        return self.store_of()

    @property
    def owns_a_place_alone(self) -> bool:
        """Is a place of this call's in line with no message known to go with it? (A failed
        publish must free it, or it holds the calls behind it until it lapses.)"""
        return self.state == "placed"

    def take_place_apart(self) -> None:
        """Take the place in a round trip of its own, before the message goes out (where one
        script cannot write both); Redis unreachable is :attr:`unavailable`'s to judge."""
        _take_place(self, self.ttl_ms)

    def leave_apart(self) -> None:
        """The call's publish failed, or was cut short: a place it took apart from its message
        goes, else it would hold the calls behind it until it lapses (and name a call that
        never runs). Once its script is sent, the place and the message are both there or
        neither: nothing to leave."""
        _leave_place(self)


@dataclass(eq=False)
class StartPlan:
    """What the publish of a call with ``key_rate_limit`` writes with its message: its
    reserved start (start.lua's "call"), and its place in line with both limits; the
    message's eta is its start's, when that is later than the call's own."""

    store_of: Callable[[], Store]
    #: The key's starts and plan keys (line, due and seq too, with both limits).
    keys: Mapping[str, str]
    task_id: str
    #: N starts per period (ms).
    count: int
    period_ms: int
    #: The call's own countdown or eta, ms from now (0: none).
    earliest_ms: int
    #: Called when a start or place taken apart from the push cannot be had (Redis
    #: unreachable): raises to refuse the publish, or returns to publish without them.
    unavailable: Callable[[RedisUnavailable], None]
    #: Both limits: how long its place in line waits (None: no place, a rate alone).
    place: PlaceWait | None = None
    #: As :class:`LinePlan`'s (a start alone is never "placed").
    state: Literal["absent", "sent", "placed", "pushed", "dropped"] = "absent"
    #: A start was asked for apart from the message (:meth:`reserve_apart`): it is in the
    #: plan until the message's run starts, or :meth:`leave_apart` takes it out.
    reserved: bool = False

    @property
    def store(self) -> Store:
        return self.store_of()

    @property
    def owns_a_place_alone(self) -> bool:
        """As :attr:`LinePlan.owns_a_place_alone`."""
        return self.state == "placed"

    def reserve_apart(self) -> int:
        """Reserve the start, then (with both limits) take the place, each in a round trip of
        its own, before the message goes out; returns the message's delay, ms: its start's,
        where that is later than the call's own. Redis unreachable is :attr:`unavailable`'s
        to judge (the call's own delay stands)."""
        # (Asked, it may be reserved: a take cut short by a signal handler's exception too.)
        self.reserved = True
        try:
            wait_ms = self.store.next_start(
                self.keys, self.task_id, self.count, self.period_ms, earliest_ms=self.earliest_ms
            )
        except RedisUnavailable as exc:
            self.reserved = False  # (unreachable: nothing to give back; what it wrote lapses)
            self.unavailable(exc)
            wait_ms = 0
        delay_ms = wait_ms if wait_ms > max(self.earliest_ms, 1) else self.earliest_ms
        if self.place is not None:
            _take_place(self, self.place.ms_after(delay_ms))
        return delay_ms

    def leave_apart(self) -> None:
        """The call's publish failed, or was cut short: what it took apart from its message
        goes, its place in line (as :meth:`LinePlan.leave_apart`) and its start, back to the
        plan, where it would have stayed a period for a message that never existed (the
        next call waiting for nothing). A message whose fate is unknown loses nothing: each
        run checks the starts made as it starts, so the limit holds there."""
        _leave_place(self)
        if not self.reserved:
            return
        self.reserved = False
        try:
            self.store.give_back_start(self.keys, self.task_id)
        except RedisUnavailable as exc:
            logger.warning(
                "%s keeps its reserved start until it lapses a period on: %s",
                self.task_id,
                exc.cause,
            )


def _take_place(plan: LinePlan | StartPlan, ttl_ms: int) -> None:
    """A place in line for ``plan``'s call, apart from its message: ``placed`` as it is asked
    for. A take cut short (a soft time limit while its answer is awaited) may have placed it:
    the exception that unwinds the call leaves the line, as a failed publish does."""
    plan.state = "placed"
    try:
        plan.store.take_ticket(plan.keys, plan.task_id, ttl_ms)
    except RedisUnavailable as exc:
        plan.state = "absent"  # (unreachable: a leave would fail too; what it wrote lapses)
        plan.unavailable(exc)


def _leave_place(plan: LinePlan | StartPlan) -> None:
    """Free ``plan``'s place in line if it was taken apart and no message is known to go with
    it (:attr:`LinePlan.owns_a_place_alone`)."""
    if not plan.owns_a_place_alone:
        return
    try:
        plan.store.leave_line(plan.keys, plan.task_id)
    except RedisUnavailable as exc:
        logger.warning("%s keeps its place in line until it lapses: %s", plan.task_id, exc.cause)
