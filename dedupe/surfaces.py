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
    from celery import Celery

__all__ = ["ChannelSurface", "ProducerSurface", "RequestSurface", "TaskSurface"]


class RequestSurface(Protocol):
    """Celery's task request (``task.request``: a ``celery.app.task.Context``).

    Its members are read-only here, so that Celery's own types (whose attributes are more
    precise) fit it.
    """

    @property
    def id(self) -> str | None: ...
    @property
    def args(self) -> Sequence[object] | None: ...
    @property
    def kwargs(self) -> Mapping[str, object] | None: ...
    @property
    def headers(self) -> Mapping[str, object] | None: ...
    @property
    def retries(self) -> int: ...
    @property
    def is_eager(self) -> bool: ...
    @property
    def called_directly(self) -> bool: ...
    @property
    def delivery_info(self) -> Mapping[str, object] | None: ...
    @property
    def chain(self) -> object: ...
    @property
    def callbacks(self) -> object: ...
    @property
    def errbacks(self) -> object: ...
    @property
    def chord(self) -> object: ...
    @property
    def group(self) -> object: ...


class TaskSurface(Protocol):
    """A Celery task (``celery.Task``), bound to its app."""

    @property
    def name(self) -> str: ...
    @property
    def acks_late(self) -> bool: ...
    @property
    def ignore_result(self) -> bool: ...
    @property
    def request(self) -> RequestSurface: ...
    @property
    def app(self) -> Celery: ...


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
