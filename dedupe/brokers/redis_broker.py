"""kombu's Redis transport as a broker: one script can write a call's record and push its
message, and a dead worker's unacked message stays in a hash the workers can read until the
visibility timeout gives it back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager

from celery import Celery

from dedupe.compat import kombu_private
from dedupe.recovery.unacked import RestartWatch
from dedupe.store.commands.lines import Handed
from dedupe.store.store import Store
from dedupe.surfaces import ProducerSurface
from dedupe.values.redelivery import redis_redelivery, visibility_gap

from .hand_off import publish_handed
from .message_search import Search
from .plans import LinePlan, PushPlan, StartPlan
from .redis_messages import search_redis_broker
from .redis_publish import pushing_in_line, pushing_through_many
from .server import ServerAddress

__all__ = ["RedisBroker"]


class RedisBroker:
    """The Redis broker of ``app`` (:class:`~dedupe.brokers.broker.Broker`) at ``address``
    (None: a form whose server cannot be told from its URL)."""

    name = "redis"

    def __init__(self, app: Celery, address: ServerAddress | None) -> None:
        self._app = app
        self.address = address
        self._redelivery = redis_redelivery(app)

    @property
    def redelivery(self) -> float | None:
        return self._redelivery

    @property
    def lists_unacked(self) -> bool:
        return True

    def is_store(self, store: Store) -> bool:
        server = store.server
        return (
            self.address is not None
            and server is not None
            and self.address == ServerAddress.of_client(server)
        )

    def pushing_through(
        self, producer: ProducerSurface, plans: Mapping[str, PushPlan]
    ) -> ContextManager[None]:
        return pushing_through_many(producer, plans)

    def pushing_in_line(
        self, producer: ProducerSurface, plan: LinePlan | StartPlan
    ) -> ContextManager[None]:
        return pushing_in_line(producer, plan)

    def restart_watch(self, store: Store, prefix: str, lease: float) -> RestartWatch | None:
        # One that is the dedup store loses its unacked messages with the records; a Cluster
        # store has many servers to lose.
        if store.server is None or self.is_store(store) or not kombu_private.UNACKED:
            return None
        return RestartWatch(self._app, store, prefix, lease, self._redelivery)

    def redelivery_warning(self, tasks: Iterable[tuple[str, float]]) -> str | None:
        return visibility_gap(self._redelivery, tasks)

    def search(self, calls: Mapping[str, str]) -> Search | None:
        if not kombu_private.QUEUES:
            return None
        return search_redis_broker(self._app, calls.keys())

    def hand_off(self, app: Celery, key: str, handed: Sequence[Handed]) -> None:
        publish_handed(app, key, handed)
