"""Any broker but Redis (RabbitMQ, SQS, ...): the record is written apart from the message, and
a dead worker's unacked message comes back as its connection drops."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from typing import TYPE_CHECKING

from dedupe.surfaces import ProducerSurface

from .plans import LinePlan, PushPlan, StartPlan

if TYPE_CHECKING:
    from dedupe.recovery.unacked import RestartWatch
    from dedupe.store.store import Store

__all__ = ["OtherBroker"]


class OtherBroker:
    """A broker with no one-step publish and nothing a worker restores from
    (:class:`~dedupe.brokers.broker.Broker`)."""

    name = "other"

    @property
    def redelivery(self) -> float | None:
        return None

    @property
    def lists_unacked(self) -> bool:
        return False

    def is_store(self, store: Store) -> bool:
        return False

    def pushing_through(
        self, producer: ProducerSurface, plans: Mapping[str, PushPlan]
    ) -> ContextManager[None]:
        return nullcontext()

    def pushing_in_line(
        self, producer: ProducerSurface, plan: LinePlan | StartPlan
    ) -> ContextManager[None]:
        return nullcontext()

    def restart_watch(self, store: Store, prefix: str, lease: float) -> RestartWatch | None:
        return None

    def redelivery_warning(self, tasks: Iterable[tuple[str, float]]) -> str | None:
        return None
