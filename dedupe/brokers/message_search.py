"""What one look for messages on a broker found (:meth:`dedupe.brokers.broker.Broker.search`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Search"]


@dataclass(frozen=True, slots=True)
class Search:
    """What one look at the broker found: the task ids asked for that have a message, and
    how many messages and queues it read to know (its cost)."""

    found: frozenset[str]
    messages: int
    queues: int
