"""What every command mixin of the :class:`~dedupe.store.store.Store` shares: its client, its
script runner, the data-loss barrier, and the reading of replies they all make."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from dedupe.errors import UnexpectedReply
from dedupe.store.clients import DedupRedis
from dedupe.store.runner import ScriptCalls
from dedupe.values.keys import CallKeys

__all__ = ["DataLossBarrier", "StoreBase", "integer_reply", "raise_first_error"]

_T = TypeVar("_T")


class DataLossBarrier(Protocol):
    """Keeps calls from being decided on a store that lost its data (a restart without
    persistence, a failover to a replica without it, a FLUSHALL) until the records of the
    messages in flight are back: an absent key may be a lost record, whose message a new
    call would duplicate. ``dedupe.recovery.unacked.RestartWatch`` is the one there is."""

    #: The key whose absence says the data was lost (and not restored yet).
    marker: str

    def armed(self) -> bool:
        """Ask with the marker now? (Not for a while after a restore that failed.)"""

    def restore(self) -> None:
        """Restore the records, then set the marker (once per process at a time). Never
        raises: a failure is logged, and disarms the barrier for a while."""


class StoreBase:
    """The state the store's command mixins share, set up by :class:`~dedupe.store.store.Store`."""

    #: Set by the runtime where lost records can be restored (a Redis broker with a dedup
    #: Redis of its own): every enqueue then asks with its marker.
    barrier: DataLossBarrier | None = None

    client: DedupRedis
    #: The script runner: one server's or a Cluster's.
    _run: ScriptCalls

    def _barrier(self) -> DataLossBarrier | None:
        barrier = self.barrier
        return barrier if barrier is not None and barrier.armed() else None

    def _restore_lost(self, barrier: DataLossBarrier | None) -> None:
        # (The restore never raises: it logs its failures, and the call is decided anyway.)
        assert barrier is not None
        barrier.restore()

    def _forget(self, keys: CallKeys) -> None:
        # Redis pushes the change to this thread's connection as well, but the caller may
        # ask again before reading it (the write goes on another connection).
        self._run.forget(keys.call)

    def _command(self, attempt: Callable[[], _T]) -> _T:
        """A command of the client itself: on a Cluster under the script runner's retries
        and budget (the cluster client's own are off), else under the client's."""
        return self._run.command(attempt)


def integer_reply(script: str, reply: object) -> int:
    """A script's integer reply; anything else (a bool included) is unexpected."""
    if isinstance(reply, bool) or not isinstance(reply, int):
        raise UnexpectedReply(script, reply)
    return reply


def raise_first_error(replies: Sequence[object]) -> None:
    """Raise the first error reply of a batch's replies, if any."""
    # Inside reraise_unavailable: "not now" refusals become RedisUnavailable, others
    # RedisCommandError. (On one server a batch is refused whole, for a reason that holds for
    # every call of it; on a Cluster the calls that went through stand, provisional: their
    # ttl frees them.)
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
