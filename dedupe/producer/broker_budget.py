"""The call budget at the broker: no publish waits on the broker past the call's deadline
(:func:`within_budget`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager as ContextManager
from typing import TYPE_CHECKING, Any

from celery import Celery
from kombu import Connection
from kombu.exceptions import OperationalError

from dedupe.surfaces import ProducerSurface
from dedupe.values.config import SettingReader

if TYPE_CHECKING:
    from .call import CallOptions

__all__ = ["BrokerBudget", "within_budget"]

_publish_retry = SettingReader("task_publish_retry")
_publish_retry_policy = SettingReader("task_publish_retry_policy")
#: What kombu's connection retries take from a retry policy or from transport options.
_RETRY_KEYS = ("max_retries", "interval_start", "interval_step", "interval_max")
_ABSENT = object()


class BrokerBudget:
    """kombu's ``errback`` for the connection retries of a publish: gives up with kombu's
    ``OperationalError`` (what a plain call raises when its retry policy runs out) before a
    wait would take the call past its deadline; the retry policy's own errback is called
    first. Enforced only in the call's thread and until its publish is over: kombu 5.7
    copies a retry policy into the transport options its pooled connections share, where
    another publish's retries may find it."""

    def __init__(self, connection: Connection, budget: float, deadline: float) -> None:
        self._connection = connection
        self._budget = budget
        self._deadline = deadline
        self._thread = threading.get_ident()
        self.active = True
        #: The errback of the retry policy of the publish under way, called first.
        self.then: Callable[..., object] | None = None

    def __call__(self, exc: BaseException, interval: float) -> object:
        answer = self.then(exc, interval) if self.then is not None else None
        if (
            self.active
            and threading.get_ident() == self._thread
            and time.monotonic() + interval > self._deadline
        ):
            raise OperationalError(self.message(exc)) from exc
        return answer

    def message(self, exc: BaseException) -> str:
        broker = self._connection.as_uri()  # (the password masked)
        return (
            f"the broker at {broker} did not answer within the call budget "
            f"(dedupe_call_budget={self._budget} s): {type(exc).__name__}: {exc}. Start the "
            f"broker or make it reachable; to wait longer, raise dedupe_call_budget (0: the "
            f"retry policy alone, task_publish_retry_policy)"
        )


def within_budget(
    producer: ProducerSurface,
    app: Celery,
    budget: float,
    deadline: float | None,
    calls_options: Sequence[CallOptions],
) -> ContextManager[None]:
    """Publish the calls of ``calls_options`` through ``producer`` in the block, waiting on
    the broker until ``deadline`` (``time.monotonic()``; None: no budget) at most.

    Connects first, if the producer never did, with the retries the publish would make (the
    call's retry policy, as kombu 5.7 reconnects with it): the seams ask for the producer's
    channel before kombu's publish, and kombu opens one outside its retry with its connect
    timeout (``broker_connection_timeout``: 4 s, 6 s by its retry intervals). Then kombu's
    own retries of each publish, through the errback of its ``retry_policy``."""
    return _WithinBudget(producer, app, budget, deadline, calls_options)


class _WithinBudget:
    """:func:`within_budget`'s block (a class: a generator-based one costs every call more).

    The errback goes into the retry policy of each publish of the block through a shadow of
    the producer's ``publish``, not into the calls' options: ``before_task_publish``
    receivers get the retry policy a plain call gives them."""

    __slots__ = (
        "_app",
        "_before",
        "_calls_options",
        "_connection",
        "_errback",
        "_installed",
        "_producer",
        "_shadowed",
    )

    def __init__(
        self,
        producer: ProducerSurface,
        app: Celery,
        budget: float,
        deadline: float | None,
        calls_options: Sequence[CallOptions],
    ) -> None:
        self._producer = producer
        self._app = app
        self._calls_options = calls_options
        # (Any: celery-types makes the transport options optional; kombu always has them.)
        connection: Any = producer.connection
        self._connection = connection
        self._errback = (
            BrokerBudget(connection, budget, deadline)
            if deadline is not None and connection is not None
            else None
        )
        self._before: object = _ABSENT
        self._installed = False
        #: What the producer instance had as its ``publish`` before the shadow (_ABSENT: none).
        self._shadowed: object = _ABSENT

    def __enter__(self) -> None:
        connection, errback = self._connection, self._errback
        if connection is None:
            return
        if errback is not None:
            self._before = connection.transport_options.get("errback", _ABSENT)
        if not connection.connected:
            try:
                _connect(connection, self._app, self._calls_options, errback)
            except BaseException:
                self._done()
                raise
        if errback is not None:
            producer = self._producer
            self._shadowed = producer.__dict__.get("publish", _ABSENT)
            producer.__dict__["publish"] = _publishing(producer.publish, errback)
            self._installed = True

    def __exit__(self, *_: object) -> None:
        self._done()

    def _done(self) -> None:
        errback = self._errback
        if errback is None:
            return
        errback.active = False
        if self._installed:
            producer = self._producer
            if self._shadowed is _ABSENT:
                producer.__dict__.pop("publish", None)
            else:
                producer.__dict__["publish"] = self._shadowed
        options = self._connection.transport_options
        if options.get("errback") is errback:  # (kombu 5.7 copied it there)
            if self._before is _ABSENT:
                options.pop("errback", None)
            else:
                options["errback"] = self._before


def _publishing(publish: Callable[..., object], errback: BrokerBudget) -> Callable[..., object]:
    """``publish`` (a producer's) with ``errback`` in the retry policy of a retried publish."""

    def publish_within_budget(body: object, *args: object, **kwargs: Any) -> object:
        if kwargs.get("retry") and not args:
            policy = kwargs.get("retry_policy") or {}
            errback.then = policy.get("errback")
            kwargs["retry_policy"] = {**policy, "errback": errback}
        return publish(body, *args, **kwargs)

    return publish_within_budget


def _connect(
    connection: Connection,
    app: Celery,
    calls_options: Sequence[CallOptions],
    errback: Any,
) -> None:
    """Connect as kombu's publish would: with the retries of the call's policy (kombu 5.7
    copies it into the transport options its channel connects with), else of the transport
    options; within ``errback``'s budget."""
    first = calls_options[0] if calls_options else {}
    retry = first.get("retry")
    if retry is None:
        retry = _publish_retry(app)
    transport_options = connection.transport_options or {}
    retries = {key: transport_options[key] for key in _RETRY_KEYS if key in transport_options}
    own = transport_options.get("errback")
    if retry:
        policy = {**(_publish_retry_policy(app) or {}), **(first.get("retry_policy") or {})}
        retries.update((key, policy[key]) for key in _RETRY_KEYS if key in policy)
        own = policy.get("errback")
    if isinstance(own, BrokerBudget):
        own = None  # (another call's, left by kombu)
    if isinstance(errback, BrokerBudget):
        errback.then = own
    else:
        errback = own
    timeout = transport_options.get("connect_retries_timeout", connection.connect_timeout)
    connection.ensure_connection(errback=errback, timeout=timeout, **retries)
