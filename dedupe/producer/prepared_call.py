"""A prepared call published through Celery (:class:`PreparedCall`): through the broker's
seam with its record, deciding at the push, or plain after a first write of unknown fate.

Every producer entry point (and the asyncio twin, :mod:`dedupe.producer.aio`) publishes
through a :class:`PreparedCall`. On a Redis broker that is the dedup store, an accepted call
is one round trip that writes its record and pushes its message; otherwise a provisional
record is written before the publish. A call refused at the push unsubscribes its result.

On any broker, a provisional record's verdict can be read at the push
(:func:`publishing_at_push`), so Redis decides while Celery and kombu do their CPU work. The
same seam notes when the transport has taken the message: an exception after that (Celery's
steps after the publish, an interruption) confirms the record instead of withdrawing it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass

from celery import Celery

from dedupe.brokers.declarations import declaring_once
from dedupe.brokers.plans import PushPlan, Refused
from dedupe.brokers.publisher_confirms import is_confirming, telling_the_confirm
from dedupe.brokers.shadowing import shadowing
from dedupe.errors import RedisUnavailable
from dedupe.events import ACCEPTED, emit
from dedupe.store.connections import Reply
from dedupe.store.store import Store
from dedupe.surfaces import ProducerSurface
from dedupe.values.header import HEADER, LATEST, publishing
from dedupe.values.keys import CallKeys
from dedupe.values.record import Holder
from dedupe.values.record_state import RecordState

from .broker_budget import within_budget
from .call import Publish, producer_block
from .call_sender import sender_for
from .publish_signals import end_refused, forget_begun
from .record_moves import RecordMoves
from .result import DedupeResult, mark_result

__all__ = ["PendingDecision", "PreparedCall", "forget_result", "publishing_at_push"]

logger = logging.getLogger("dedupe.producer")


class PreparedCall(RecordMoves):
    """A call decided up to its Redis round trips, and published: the sync and asyncio
    drivers make the first write, if any, each with its own client;
    :meth:`publish_with_record` (blocking) does the rest for both."""

    def within_budget(self, producer: ProducerSurface) -> contextlib.AbstractContextManager[None]:
        """The block of this call's publish through ``producer``: no wait on the broker past
        the call budget (:func:`~dedupe.producer.broker_budget.within_budget`)."""
        return within_budget(
            producer, self.call.app, self.shape.budget, self.deadline, [self.call.options]
        )

    def publish(self, through: Publish | None = None) -> DedupeResult:
        """Send the message through Celery, as it is (blocking); ``through``: a publish that
        stands for the call's own (a batch's sender)."""
        call = self.call
        if self.kind != "eager":
            headers = dict(call.options.get("headers") or {})
            headers[HEADER] = self.header.encode()
            if self.latest is not None:
                unique = self.shape.unique
                assert unique is not None
                headers[LATEST] = unique.latest  # (its run takes the latest arguments)
            call.options["headers"] = headers
        with publishing():
            try:
                sent = (through or call.publish)(call.args, call.kwargs, call.options)
            except Refused:
                end_refused(self.task_id)
                raise
            finally:
                forget_begun()
        if self.kind == "eager":
            return mark_result(sent, deduplicated=False)
        # (No store when none could be made: a Cluster no node of which answered.)
        store = self.runtime.existing_store
        return mark_result(sent, deduplicated=False, keys=self.keys, store=store)

    def publish_with_record(self) -> DedupeResult:
        """Publish the message, with its record as the path says (blocking: the asyncio
        driver runs it in a thread). A call refused at the push is a duplicate."""
        try:
            result = self._publish_through_seam()
        except Refused as refused:
            return self.duplicate(refused.holder)
        except BaseException:
            # The message may not exist: free the key so the caller's retry is not refused
            # (never after publish.lua was sent: if it ran, the record has its message).
            self.cancel_after_failure()
            raise
        if self.path in ("overlap", "confirm"):
            self.confirm_record()
        self.note_accepted(self.path)
        return result

    def note_accepted(self, path: str) -> None:
        """Count the call as accepted, and say so (event ``call_accepted``)."""
        self.runtime.count_call(self.call.task_name, duplicate=False)
        emit(ACCEPTED, self.call.task_name, self.task_id, self.keys.call, path=path)

    def _publish_through_seam(self) -> DedupeResult:
        call = self.call
        decision = self._start_deciding() if self.path == "overlap" else None
        # From here the enqueue is out: anything that raises before the publish settles it
        # (an exception from a signal handler while a producer is awaited) withdraws it.
        try:
            result = self._publish_on_a_producer(decision)
        except Refused:
            # Celery subscribed to the result of a task id that will never exist.
            forget_result(call.app, self.task_id)
            raise
        except BaseException:
            self._decided(decision, published=False)
            raise
        if self.path == "overlap":
            # Its record is the decision's (none when the enqueue could not even be sent).
            self._decided(decision)
        elif self.path != "confirm":  # (its record was written first: confirmed after this)
            self.settle_publish()
        return result

    def _publish_on_a_producer(self, decision: PendingDecision | None) -> DedupeResult:
        """The publish on the call's producer, or one of the app's pool (what Celery's
        producer_or_acquire does, without its second look at the settings)."""
        call = self.call
        refused = None
        with producer_block(call) as producer:
            call.options["producer"] = producer
            try:
                with (
                    self.within_budget(producer),
                    self._seam(producer, decision),
                    declaring_once(producer),
                ):
                    result = self.publish(sender_for(call, producer))
            except Refused as exc:
                # Caught inside the block: kombu (5.5+) replaces the connection of a pooled
                # producer that an exception leaves.
                refused = exc
        if refused is not None:
            raise refused
        return result

    def _start_deciding(self) -> PendingDecision | None:
        plan = self.plan
        try:
            reply = self.store.start_enqueue(self.keys, plan.provisional, plan.provisional_ttl_ms)
            return PendingDecision(
                self.store,
                self.keys,
                reply,
                plan.provisional,
                plan.provisional_ttl_ms,
                self.first_write_failed,
            )
        except RedisUnavailable as exc:
            self.first_write_failed(exc)
            return None
        except BaseException:
            # (A script the connection has not run yet, or one idle a while, is sent and read
            # at once: an interruption there, or before its decision is kept, leaves its fate
            # unknown.)
            self.withdraw_first_write()
            raise

    def _seam(
        self, producer: ProducerSurface, decision: PendingDecision | None
    ) -> ContextManager[None]:
        if self.path == "one-step" or self.path == "decide":
            return self.runtime.broker.pushing_through(producer, {self.task_id: self.plan})
        return publishing_at_push(producer, self.plan, decision)

    def _decided(self, decision: PendingDecision | None, *, published: bool = True) -> None:
        """Settle the overlap path's decision after the publish (or, ``published=False``,
        its failure)."""
        if decision is None:
            return
        decided_at_push = decision.decided
        if decision.decided and not decision.read:
            # Its read was interrupted (the exception this unwinds from): what the enqueue
            # wrote, if anything, is withdrawn by its bytes, never by its task id alone.
            if self.plan.state is RecordState.ABSENT:
                self.plan.move(RecordState.ASKED)
            return
        try:
            holder = decision.decide()
        except RedisUnavailable:
            holder = None  # the policy said raise, but the message may be out: go on
        if holder is None and self.plan.state is RecordState.ABSENT:
            self.plan.move(RecordState.PROVISIONAL)  # (unknown, if the decision failed)
        # A publish that raised before the push read the verdict sent nothing to warn of.
        if holder is not None and not decided_at_push and published:
            self._warn_second_message(holder)

    def publish_unrecorded(self) -> DedupeResult:
        """The publish after a first write of unknown fate: plain (what the write left, if
        anything, the provisional ttl frees), within what is left of the call budget."""
        call = self.call
        with producer_block(call) as producer:
            call.options["producer"] = producer
            with self.within_budget(producer), publishing_at_push(producer, self.plan, None):
                try:
                    return self.publish()
                except BaseException:
                    self.take_back_hand_over()
                    raise


def forget_result(app: Celery, task_id: str) -> None:
    """Undo the result backend's subscription to a task id that was never published."""
    consumer = getattr(app.backend, "result_consumer", None)
    cancel_for = getattr(consumer, "cancel_for", None)
    if callable(cancel_for):
        try:
            cancel_for(task_id)
        except Exception as exc:  # a subscription is no reason to fail a call
            logger.debug("could not unsubscribe from %s: %r", task_id, exc)


@dataclass(eq=False)
class PendingDecision:
    """An ``enqueue`` sent and not yet read: the verdict on a provisional record."""

    store: Store
    keys: CallKeys
    reply: Reply
    #: The provisional record the enqueue was sent with, and its ttl (sent again after a
    #: restore: see :class:`~dedupe.store.commands.base.DataLossBarrier`).
    record: bytes
    ttl_ms: int
    #: Called when the answer cannot be had (Redis unreachable): raises to refuse the
    #: publish, or returns to publish without dedup.
    unavailable: Callable[[RedisUnavailable], None]
    #: Its read began (once: a failed read is not tried again).
    decided: bool = False
    #: Its read ended: with the verdict, or Redis unavailable (not cut short by an exception).
    read: bool = False
    holder: Holder | None = None

    def decide(self) -> Holder | None:
        """The holder that makes the call a duplicate, or None (read once)."""
        if not self.decided:
            self.decided = True
            try:
                self.holder = self.store.enqueue_result(
                    self.keys, self.reply, self.record, self.ttl_ms
                )
            except RedisUnavailable as exc:
                self.read = True
                self.unavailable(exc)
            self.read = True
        return self.holder


def publishing_at_push(
    producer: ProducerSurface, plan: PushPlan, decision: PendingDecision | None
) -> ContextManager[None]:
    """The publish made in the block, on any transport: ``decision`` (if any) read at its push,
    a duplicate unwinding as :class:`Refused` before the message reaches the broker; once the
    transport has the message, the provisional record awaits its confirm (``plan``). Under
    publisher confirms: a Nack gives the record up, and a wait for the broker's answer cut
    short (the message queued or lost) leaves it provisional if the publish raises."""
    channel = producer.channel
    # The transport's, confirm mode included.
    transport_publish: Callable[..., object] = channel.basic_publish
    confirming = is_confirming(channel)

    def out() -> None:
        plan.taken = True
        if plan.state is RecordState.ABSENT and decision is not None and decision.read:
            plan.move(RecordState.PROVISIONAL)
        if plan.state is RecordState.PROVISIONAL:
            plan.move(RecordState.AWAITING_CONFIRM)

    def refused() -> None:
        plan.taken = False
        if plan.state is RecordState.AWAITING_CONFIRM:
            plan.move(RecordState.UNROUTED)

    def unanswered() -> None:
        # Queued or lost. Told apart only if the publish raises after all (kombu may send
        # it again on a new connection, and return): see cancel_after_failure.
        plan.unanswered = True

    def basic_publish(message: object, *args: object, **kwargs: object) -> object:
        if decision is not None:
            holder = decision.decide()
            if holder is not None:
                raise Refused(holder)
        if confirming:
            with telling_the_confirm(channel, out, refused, unanswered):
                sent = transport_publish(message, *args, **kwargs)
        else:
            sent = transport_publish(message, *args, **kwargs)
        # (Celery's task-sent event, if any, follows on this channel: the task's came first.)
        out()
        return sent

    return shadowing(channel, basic_publish=basic_publish)
