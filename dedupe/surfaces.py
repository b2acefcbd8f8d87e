"""The parts of Celery's task and request, and of kombu's channel and producer, that dedupe
uses: one Protocol each, in one place (a leaf: every layer may import it).

Each names only what the package reads or calls, so a type checker shows where the code
leans on Celery or kombu, and a test double or another Celery release needs no more. Private
members are not here: they are read in :mod:`dedupe.compat` alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kombu import Connection, Exchange

__all__ = ["ChannelSurface", "ProducerSurface", "RequestSurface", "TaskSurface"]


class RequestSurface(Protocol):
    """Celery's task request (``task.request``: a ``celery.app.task.Context``)."""

    id: str | None
    args: Sequence[Any] | None
    kwargs: Mapping[str, Any] | None
    headers: Mapping[str, Any] | None
    retries: int
    is_eager: bool
    called_directly: bool
    delivery_info: Mapping[str, Any] | None


class TaskSurface(Protocol):
    """A Celery task (``celery.Task``), bound to its app."""

    name: str
    acks_late: bool
    ignore_result: bool

    @property
    def request(self) -> RequestSurface: ...


class ChannelSurface(Protocol):
    """A kombu channel, as a publish seam stands in for its methods on one instance."""

    __dict__: dict[str, Any]

    def basic_publish(self, message: Any, exchange: str, routing_key: str, **kwargs: Any) -> Any:
        """Send one message (the transport's own)."""


class ProducerSurface(Protocol):
    """A kombu producer (``kombu.Producer``), as Celery hands it to a publish."""

    __dict__: dict[str, Any]

    @property
    def channel(self) -> ChannelSurface: ...

    def publish(self, body: Any, **kwargs: Any) -> Any:
        """Publish one message."""

    @property
    def exchange(self) -> Exchange:
        """The exchange a publish naming none goes to."""

    @property
    def connection(self) -> Connection | None:
        """The connection of the producer's channel."""

    def maybe_declare(self, entity: object, retry: bool = False, **retry_policy: object) -> bool:
        """Declare ``entity`` unless the connection's declaration cache holds it."""
