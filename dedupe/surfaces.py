"""Celery's and kombu's types as dedupe meets them, in one place (a leaf: every layer may
import it): one Protocol each for the parts of Celery's task and request and of kombu's
channel and producer that dedupe uses, and aliases of Celery's generic classes.

A Protocol names only what the package reads or calls. Private members are not here: they
are read in :mod:`dedupe.compat` alone. celery-types makes ``Task`` and ``AsyncResult``
generic for the type checker; only Celery 5.7 can subscript them at run time (5.3 to 5.6
raise ``TypeError``), so the checker sees the generic forms, the interpreter the plain ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:
    from kombu import Connection, Exchange

from celery import Task
from celery.result import AsyncResult

if TYPE_CHECKING:
    from celery import Celery

__all__ = [
    "AnyAsyncResult",
    "AnyTask",
    "ChannelSurface",
    "ProducerSurface",
    "RequestSurface",
    "TaskOrName",
    "TaskSurface",
]

if TYPE_CHECKING:
    AnyTask: TypeAlias = Task[Any, Any]
    AnyAsyncResult: TypeAlias = AsyncResult[Any]
else:
    AnyTask = Task
    AnyAsyncResult = AsyncResult

#: A task object (``@shared_task``'s proxy too), or the name of a task: what the producer
#: entry points take.
TaskOrName: TypeAlias = "AnyTask | str"


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

    @property
    def exchange(self) -> Exchange:
        """The exchange a publish naming none goes to."""

    @property
    def connection(self) -> Connection | None:
        """The connection of the producer's channel."""

    def maybe_declare(self, entity: object, retry: bool = False, **retry_policy: object) -> bool:
        """Declare ``entity`` unless the connection's declaration cache holds it."""
