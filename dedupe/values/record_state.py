"""What one call's record is in Redis, as its producer knows it, and the moves a publish makes.

================  =============================================================================
absent            nothing of this call's (no write yet, or the key left to its holder)
provisional       its provisional record, no message yet
asked             its first write was sent, Redis's answer never read (an exception came
                  between): perhaps its provisional record, these very bytes; withdraw them
unknown           a write failed, or RabbitMQ's confirm never came: perhaps provisional; final
sent              publish.lua was sent: the record and the message, or neither; never cancelled
queued            its queued record beside its message (pushed, confirmed or written after)
awaiting_confirm  the message is out beside the provisional record: confirm it
unrouted          routed nowhere (kombu) or refused (a Nack); the provisional record stays: cancel
dropped           kombu routed the message nowhere, nothing was written: nothing to do
================  =============================================================================
"""

from __future__ import annotations

import enum

__all__ = ["RecordState"]


class RecordState(enum.Enum):
    """One call's record, as its producer knows it (see the module's table)."""

    ABSENT = "absent"
    PROVISIONAL = "provisional"
    ASKED = "asked"
    UNKNOWN = "unknown"
    SENT = "sent"
    QUEUED = "queued"
    AWAITING_CONFIRM = "awaiting_confirm"
    UNROUTED = "unrouted"
    DROPPED = "dropped"

    @property
    def provisional_written(self) -> bool:
        """Is (or, unknown, may be) this call's provisional record in Redis?"""
        return self in _PROVISIONAL

    def to(self, state: RecordState) -> RecordState:
        """``state``, where a publish can move from this one; else an AssertionError (a bug:
        the producer lost track of its record)."""
        assert state is self or state in _MOVES[self], (
            f"a call's record cannot go from {self.name} to {state.name}"
        )
        return state


_PROVISIONAL = frozenset(
    {
        RecordState.PROVISIONAL,
        RecordState.ASKED,
        RecordState.UNKNOWN,
        RecordState.AWAITING_CONFIRM,
        RecordState.UNROUTED,
    }
)

# A failed write may come at any point before publish.lua is sent; after it, nothing is
# written, so unknown is final.
_MOVES: dict[RecordState, frozenset[RecordState]] = {
    RecordState.ABSENT: frozenset(
        {
            RecordState.PROVISIONAL,
            RecordState.ASKED,
            RecordState.UNKNOWN,
            RecordState.SENT,
            RecordState.QUEUED,
            RecordState.DROPPED,
        }
    ),
    RecordState.PROVISIONAL: frozenset(
        {
            RecordState.ABSENT,
            RecordState.UNKNOWN,
            RecordState.SENT,
            RecordState.QUEUED,
            RecordState.AWAITING_CONFIRM,
            RecordState.UNROUTED,
        }
    ),
    RecordState.ASKED: frozenset({RecordState.ABSENT}),
    RecordState.UNKNOWN: frozenset(),
    RecordState.SENT: frozenset({RecordState.QUEUED}),
    RecordState.QUEUED: frozenset(),
    RecordState.AWAITING_CONFIRM: frozenset(
        {RecordState.QUEUED, RecordState.ABSENT, RecordState.UNROUTED, RecordState.UNKNOWN}
    ),
    RecordState.UNROUTED: frozenset({RecordState.ABSENT}),
    RecordState.DROPPED: frozenset(),
}
