"""What differs from one kind of broker to another, behind one interface (:class:`Broker`):

- when a dead worker's unacked message comes back (``redelivery``, and its start-up warning);
- whether it is the dedup store's own Redis (``is_store``): one script writes a call's
  record (or place) with its message (``pushing_through``, ``pushing_in_line``);
- what writes back the records of its unacked messages after the dedup Redis lost its data
  (``lists_unacked``, ``restart_watch``);
- which calls' messages it may still hold, for the reaper (``search``);
- how a waiting ``key_concurrency`` call goes out when a slot is handed to it (``hand_off``).

One implementation per kind: :class:`~dedupe.brokers.redis_broker.RedisBroker` and
:class:`~dedupe.brokers.other_broker.OtherBroker`; :func:`~dedupe.brokers.choice.broker_of`
picks one once per app. What a third kind implements: docs/design-notes.md, "dedupe.brokers".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from typing import TYPE_CHECKING, Protocol

from celery import Celery

from dedupe.store.commands.lines import Handed
from dedupe.surfaces import ProducerSurface

from .message_search import Search
from .plans import LinePlan, PushPlan, StartPlan

if TYPE_CHECKING:
    from dedupe.recovery.unacked import RestartWatch
    from dedupe.store.store import Store

__all__ = ["Broker"]


class Broker(Protocol):
    """One kind of broker, as dedupe meets it."""

    #: The kind's name, for logs ("redis", "other").
    name: str

    @property
    def redelivery(self) -> float | None:
        """Seconds after its delivery at most until the broker gives back the unacked message
        of a dead worker; None where it gives it back as the worker's connection drops."""

    @property
    def lists_unacked(self) -> bool:
        """Does the broker keep every worker's unacked messages where any process can read
        them? Then :meth:`restart_watch` restores their records after a data loss; elsewhere
        each worker restores those it holds (:mod:`dedupe.recovery.held`)."""

    def is_store(self, store: Store) -> bool:
        """Is the broker the dedup store's server and database?"""

    def pushing_through(
        self, producer: ProducerSurface, plans: Mapping[str, PushPlan]
    ) -> ContextManager[None]:
        """Each publish of the block through ``producer`` writes the record of the plan of its
        task id with its message, in one step where the broker can; a message of another task
        id, or on a broker that cannot, goes out as kombu sends it."""

    def pushing_in_line(
        self, producer: ProducerSurface, plan: LinePlan | StartPlan
    ) -> ContextManager[None]:
        """:meth:`pushing_through` for a call with ``key_concurrency`` or ``key_rate_limit``:
        its place in line (or reserved start) and its message."""

    def restart_watch(self, store: Store, prefix: str, lease: float) -> RestartWatch | None:
        """What writes back the records of the broker's unacked messages after ``store`` lost
        its data; None where no worker can read those messages, or they are lost with it."""

    def redelivery_warning(self, tasks: Iterable[tuple[str, float]]) -> str | None:
        """A start-up warning for ``acks_late`` tasks (name, lease) whose key a dead worker
        holds far beyond the lease, until the broker gives its message back."""

    def search(self, calls: Mapping[str, str]) -> Search | None:
        """Of ``calls`` (task id -> task name), the task ids whose message the broker may
        still hold, read without consuming anything; None where it cannot be asked (then
        the reaper frees nothing). A message a live worker holds unacked may be left out
        where the broker hides those (the reaper asks the workers apart)."""

    def hand_off(self, app: Celery, key: str, handed: Sequence[Handed]) -> None:
        """Publish the waiting calls of ``key``'s line that a freed slot was handed to and
        that its script did not push: on a Redis broker that is the dedup store, the script
        pushed those the producer held (one round trip for the release and the push), and
        the worker publishes those it held; elsewhere the worker publishes every one. A
        worker that dies before it publishes leaves a handed slot that lapses within a
        lease, and the call is handed on again."""
