"""A provisional record's verdict read at the push, on any broker: ``enqueue`` is sent before
Celery builds the message and its answer read only as the message is about to leave, so
Redis decides while Celery and kombu do their CPU work."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from typing import Any

from dedupe.brokers.plans import Refused
from dedupe.brokers.shadowing import shadowing
from dedupe.errors import RedisUnavailable
from dedupe.store.script_runner import Reply
from dedupe.store.store import Store
from dedupe.values.keys import CallKeys
from dedupe.values.record import Holder

__all__ = ["PendingDecision", "deciding_at_push"]


@dataclass(eq=False)
class PendingDecision:
    """An ``enqueue`` sent and not yet read: the verdict on a provisional record."""

    store: Store
    keys: CallKeys
    reply: Reply
    #: The provisional record the enqueue was sent with, and its ttl (sent again after a
    #: restore: see :class:`~dedupe.store.store.DataLossBarrier`).
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


def deciding_at_push(producer: Any, decision: PendingDecision) -> ContextManager[None]:
    """Read ``decision`` at the push of the publish made in the block, on any transport: a
    duplicate unwinds as :class:`Refused` before the message reaches the broker."""
    transport_publish = producer.channel.basic_publish  # the transport's, confirm mode included

    def basic_publish(message: Any, *args: Any, **kwargs: Any) -> Any:
        holder = decision.decide()
        if holder is not None:
            raise Refused(holder)
        return transport_publish(message, *args, **kwargs)

    return shadowing(producer.channel, basic_publish=basic_publish)
