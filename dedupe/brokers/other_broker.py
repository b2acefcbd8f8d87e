"""Any broker but Redis (RabbitMQ, SQS, ...): the record is written apart from the message, and
a dead worker's unacked message comes back as its connection drops."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from typing import TYPE_CHECKING

from celery import Celery

from dedupe.store.commands.lines import Handed
from dedupe.surfaces import ProducerSurface

from .hand_off import publish_handed
from .message_search import Search
from .plans import LinePlan, PushPlan, StartPlan
from .queue_depths import search_by_depth

if TYPE_CHECKING:
    from dedupe.recovery.unacked import RestartWatch
    from dedupe.store.store import Store

__all__ = ["OtherBroker"]


class OtherBroker:
    """A broker with no one-step publish and nothing a worker restores from
    (:class:`~dedupe.brokers.broker.Broker`)."""

    name = "other"

    def __init__(self, app: Celery) -> None:
        self._app = app

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

    def search(self, calls: Mapping[str, str]) -> Search | None:
        return search_by_depth(self._app, calls)

    def hand_off(self, app: Celery, key: str, handed: Sequence[Handed]) -> None:
        publish_handed(app, key, handed)
