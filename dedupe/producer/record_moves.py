"""What a call's record needs around its publish (:class:`RecordMoves`): the first write's
answer read, a provisional record confirmed or withdrawn, the record of a message that went
out past the seam written after the fact. Each move goes through
:class:`~dedupe.values.record_state.RecordState`."""

from __future__ import annotations

import logging

from dedupe.errors import RedisUnavailable
from dedupe.store.replies import Requeue
from dedupe.values.record import Holder
from dedupe.values.record_state import RecordState

from .decided_call import DecidedCall
from .result import DedupeResult

__all__ = ["RecordMoves"]

logger = logging.getLogger("dedupe.producer")

#: Where a call's own provisional record stands, for a cancel or a confirm to act on.
_CANCELLABLE = frozenset(
    {
        RecordState.PROVISIONAL,
        RecordState.ASKED,
        RecordState.UNROUTED,
    }
)
_CONFIRMABLE = frozenset({RecordState.PROVISIONAL, RecordState.AWAITING_CONFIRM})


class RecordMoves(DecidedCall):
    """A decided call's record moves (the base of
    :class:`~dedupe.producer.prepared_call.PreparedCall`)."""

    def first_write_done(self, outcome: Holder | Requeue | None) -> DedupeResult | None:
        """Read the first write's answer (enqueue's or requeue's): a duplicate's result, or
        None to go on and publish."""
        if isinstance(outcome, Requeue):
            if outcome is Requeue.QUEUED:
                self.plan.move(RecordState.PROVISIONAL)
            else:
                logger.debug(
                    "the key of %s[%s] stays with its holder (%s)",
                    self.call.task_name,
                    self.task_id,
                    outcome.name.lower().replace("_", " "),
                )
            return None
        if outcome is not None and self.kind == "enqueue":
            return self.duplicate(outcome)
        if outcome is None:
            self.plan.move(RecordState.PROVISIONAL)
        return None

    def first_write_failed(self, exc: RedisUnavailable) -> None:
        """Redis could not be asked: raise, or log and let the caller publish anyway (a
        continuation always goes on). Whatever the write did, if it ran, is provisional: no
        later write of this call is tried (each would wait out the retry policy again, for a
        record the provisional ttl frees anyway)."""
        self.plan.move(RecordState.UNKNOWN)
        if self.kind == "enqueue" and self.runtime.config.on_redis_error == "raise":
            self._unavailable(exc, "is refused (dedupe_on_redis_error='raise')")
            raise exc
        self._unavailable(exc, "is published without dedup")

    def settle_publish(self, *, went_out: bool = True) -> None:
        """What the record needs after a publish through the Redis-broker seam, for a single
        call and each call of a batch: free the key of a message routed nowhere, confirm the
        provisional record beside a message, write the record of a message that went out
        past the seam (``went_out``: the publish did not raise)."""
        state = self.plan.state
        if state is RecordState.UNROUTED:
            self.cancel_record()
        elif state is RecordState.AWAITING_CONFIRM:
            self.confirm_record()
        elif went_out and state in (RecordState.ABSENT, RecordState.PROVISIONAL):
            self.record_after_the_fact()

    def cancel_record(self) -> None:
        """Free the key of a call whose message is not out: only its own provisional record
        (nothing written, or unknown: the provisional ttl frees it; never after publish.lua
        was sent)."""
        plan = self.plan
        if plan.state not in _CANCELLABLE:
            return
        # A write whose answer was never read is withdrawn by its very bytes: by its task id
        # alone, it could take an earlier call's record of that id, or a live run's record
        # restored under it.
        exact = plan.state is RecordState.ASKED
        try:
            self.store.cancel(self.keys, self.task_id, exactly=plan.provisional if exact else None)
        except RedisUnavailable as exc:
            self._unavailable(
                exc, "was not published and its key stays (its provisional ttl frees it)"
            )
            return
        plan.move(RecordState.ABSENT)

    def withdraw_first_write(self) -> None:
        """The call was interrupted before it read Redis's answer to its first write (an
        exception raised by a signal handler: a soft time limit, an alarm): withdraw the
        provisional record that write may have made, which would otherwise answer every
        call of the key with a task id that never runs, until the provisional ttl."""
        plan = self.plan
        if plan.state is RecordState.ABSENT:
            plan.move(RecordState.ASKED)
        self.cancel_after_failure()

    def cancel_after_failure(self) -> None:
        """:meth:`cancel_record` while an exception unwinds the call (or its batch, before it
        was published): that exception is what the caller must see, whatever the cancel
        meets."""
        plan = self.plan
        if plan.state is RecordState.AWAITING_CONFIRM and plan.unanswered:
            # Its publisher confirm never came: queued or lost. The provisional record
            # stays as it is, for its short ttl (a publish that hangs leaves the same).
            plan.move(RecordState.UNKNOWN)
            return
        if plan.state is RecordState.AWAITING_CONFIRM:
            # The transport has the message (what raised came after it): its record stays.
            self.confirm_after_failure()
            return
        self.take_back_hand_over()
        try:
            self.cancel_record()
        except Exception as exc:
            logger.warning(
                "%s[%s] failed, and its provisional record could not be withdrawn (its "
                "provisional ttl frees it): %r",
                self.call.task_name,
                self.task_id,
                exc,
            )

    def confirm_after_failure(self) -> None:
        """:meth:`confirm_record` while an exception that came after the publish unwinds the
        call: that exception is what the caller must see."""
        try:
            self.confirm_record()
        except Exception as exc:
            logger.warning(
                "%s[%s] failed after its message was published, and its record could not be "
                "confirmed (its provisional ttl frees it): %r",
                self.call.task_name,
                self.task_id,
                exc,
            )

    def confirm_record(self) -> None:
        """Make the provisional record beside a published message durable (sent without
        waiting for its reply)."""
        plan = self.plan
        if plan.state not in _CONFIRMABLE:
            return
        try:
            self.store.send_confirm(self.keys, plan.provisional, plan.queued, plan.ttl_ms)
        except RedisUnavailable as exc:
            self._unavailable(
                exc,
                "is published but its key is not confirmed (the provisional ttl frees it)",
            )
            return
        plan.move(RecordState.QUEUED)

    def record_after_the_fact(self) -> None:
        """Write the record of a message that went out past the seam."""
        # kombu published on another channel (a retry after a connection error, a producer
        # of another transport): the message is out without its record.
        plan = self.plan
        logger.debug("%s went out through kombu alone; writing its record now", self.task_id)
        try:
            outcome = self.store.publish(
                self.keys,
                plan.queued,
                plan.ttl_ms,
                "",
                (),
                provisional=plan.provisional if plan.state.provisional_written else b"",
            )
        except RedisUnavailable as exc:
            self._unavailable(exc, "is published without its key")
            return
        plan.pushed(outcome)
        if isinstance(outcome, Holder) and self.kind == "enqueue":
            self._warn_second_message(outcome)

    def _warn_second_message(self, holder: Holder) -> None:
        # The message went out on a channel the seam did not see, so it was never refused.
        logger.warning(
            "%s was published while %s held its key (kombu retried the publish on a new "
            "connection): two messages of one call are queued",
            self.task_id,
            holder.task_id,
        )
