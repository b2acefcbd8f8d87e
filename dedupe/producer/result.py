"""The result every dedup entry point returns."""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

from celery.result import AsyncResult
from vine import promise

from dedupe.compat import celery_private
from dedupe.errors import DedupeError
from dedupe.surfaces import AnyAsyncResult
from dedupe.values.keys import CallKeys

if TYPE_CHECKING:
    from dedupe.store.store import Store
    from dedupe.values.record import Holder

__all__ = ["DedupeResult", "duplicate_result", "mark_result"]

logger = logging.getLogger("dedupe.producer")


class DedupeResult(AnyAsyncResult):
    """An `celery.result.AsyncResult` for the task that will do the work.

    ``deduplicated`` is False when this call published the task, True when an existing
    holder of the key was found (then ``id`` is the holder's task id and ``holder`` tells
    whether it is queued or running).

    ```python
    result = refresh_report.delay_unique(42)
    result.deduplicated, result.id                 # (False, '5b1f...')
    ```
    """

    deduplicated: bool = False
    #: The Redis keys of the call (None in eager mode).
    keys: CallKeys | None = None
    #: For a duplicate: the record found (``task_id``, ``state``, ``ttl``, ...).
    holder: Holder | None = None
    _dedupe_store: Store | None = None

    @classmethod
    def of_holder(cls, task_id: str, *, backend: Any, app: Any) -> DedupeResult:
        """The result of a holder's task id: what ``AsyncResult(task_id, ...)`` makes, less
        the ``on_ready`` promise, which is made when first used (see below)."""
        if not celery_private.RESULTS:
            return cls(task_id, backend=backend, app=app)
        result = cls.__new__(cls)
        result.app = app
        result.id = task_id
        result.backend = backend or app.backend
        result.parent = None
        celery_private.result_without_init(result)
        return result

    # A duplicate's result is made by the hundred in a batch, and most are dropped unread;
    # its promise (a weak method) is half the cost of the object: made on first use. A
    # result Celery made keeps the promise its __init__ set.
    @property
    def on_ready(self) -> Any:
        attributes = self.__dict__
        ready = attributes.get("on_ready")
        if ready is None:
            ready = attributes["on_ready"] = promise(celery_private.on_fulfilled(self), weak=True)
        return ready

    @on_ready.setter
    def on_ready(self, value: Any) -> None:
        self.__dict__["on_ready"] = value

    def revoke(self, *args: Any, **kwargs: Any) -> None:
        """Revoke the task. A task still queued frees its key at once, so a new call may
        queue again; a running one keeps it until the run ends (with ``terminate=True``, when
        the worker has stopped it)."""
        super().revoke(*args, **kwargs)
        if self.keys is not None and self._dedupe_store is not None:
            try:
                self._dedupe_store.cancel(self.keys, self.id)
            except DedupeError as exc:
                # The worker frees it when it meets the revoked message, else its ttl does.
                logger.warning("revoked %s but could not free its key: %s", self.id, exc)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.id} deduplicated={self.deduplicated}>"

    def __del__(self) -> None:
        if not _OLD_PENDING or not celery_private.RESULTS:
            # A duplicate's result whose id nothing waits on has nothing of Celery's to cancel
            # (its __del__ would look for waiters and try to unsubscribe, per dropped
            # duplicate: a batch's main cost after its round trip). Else Celery's way.
            if self.deduplicated and not _waits(self):
                return
            super().__del__()
            return
        # Before Celery 5.7 a dropped result stops the result consumer for its id at once:
        # (1) also while another result object of that id waits in .get(), which then never
        # returns (celery/celery#4925; dedup makes two results of one id the rule: every
        # duplicate is the holder's id); (2) with an UNSUBSCRIBE on the result connection,
        # also when the cyclic collector runs this inside a SUBSCRIBE on that connection,
        # which then waits on redis-py's pubsub lock for good. So: never while another
        # waits, and never here: the next dedup call of this thread unsubscribes.
        backend = self.backend
        if backend is None or _another_waits(self):
            return
        for waiting in celery_private.pending_results(backend):
            waiting.pop(self.id, None)
        if getattr(backend, "result_consumer", None) is not None:
            _unsubscribe_later.setdefault(backend, []).append(self.id)


# Celery 5.7 counts the result objects waiting on an id (its _remove_pending_result takes the
# result); before, one was tracked per id (it takes the task id).
_OLD_PENDING = celery_private.removes_pending_by_task_id()


# Per result backend (one per app and thread): ids whose results were dropped before
# Celery 5.7, unsubscribed at the backend's next dedup call.
_unsubscribe_later: weakref.WeakKeyDictionary[Any, list[str]] = weakref.WeakKeyDictionary()


def _unsubscribe_dropped(backend: Any) -> None:
    dropped = _unsubscribe_later.get(backend)
    while dropped:
        task_id = dropped.pop()
        if any(task_id in waiting for waiting in celery_private.pending_results(backend)):
            continue  # waited on again meanwhile
        try:
            backend.result_consumer.cancel_for(task_id)
        except Exception as exc:  # a result subscription is Celery's: never fail a call on it
            logger.debug("could not unsubscribe from the result of %s: %r", task_id, exc)


def _waits(result: AsyncResult[Any]) -> bool:
    """Does anything wait on this result's id (this very object, another, or a weak waiter
    the cyclic collector cleared before running this ``__del__``, which leaves its id's
    entry empty)? Then Celery's own ``__del__`` decides what to cancel."""
    return any(result.id in waiting for waiting in celery_private.pending_results(result.backend))


def _another_waits(result: AsyncResult[Any]) -> bool:
    for waiting in celery_private.pending_results(result.backend):
        other = waiting.get(result.id)
        if other is not None and other is not result:
            return True
    return False


def mark_result(
    result: AsyncResult[Any],
    *,
    deduplicated: bool,
    keys: CallKeys | None = None,
    store: Store | None = None,
    holder: Holder | None = None,
) -> DedupeResult:
    """Make ``result`` a ``DedupeResult``, in place, and set its dedup attributes.

    In place, not wrapped: a dropped AsyncResult unsubscribes from its task's result
    channel when garbage-collected, so a wrapper would cost the caller a resubscription.
    """
    if _OLD_PENDING and _unsubscribe_later and result.backend is not None:
        _unsubscribe_dropped(result.backend)
    if not isinstance(result, DedupeResult):
        result.__class__ = _dedupe_class(type(result))
    marked: DedupeResult = result  # type: ignore[assignment]
    marked.deduplicated = deduplicated
    marked.keys = keys
    marked.holder = holder
    marked._dedupe_store = store
    return marked


def duplicate_result(
    holder: Holder,
    *,
    backend: Any,
    task_name: str,
    app: Any,
    keys: CallKeys,
    store: Store,
) -> DedupeResult:
    """The result a duplicate call returns: the holder's task, made a DedupeResult at once."""
    result = DedupeResult.of_holder(holder.task_id, backend=backend, app=app)
    mark_result(result, deduplicated=True, keys=keys, store=store, holder=holder)
    return result


# Each app binds its own AsyncResult subclass (and a task may bring another): keep that
# class's behaviour and add ours. A handful of classes per process.
_classes: weakref.WeakKeyDictionary[type, type[DedupeResult]] = weakref.WeakKeyDictionary()


def _dedupe_class(cls: type) -> type[DedupeResult]:
    if cls is AsyncResult:
        return DedupeResult
    combined = _classes.get(cls)
    if combined is None:
        combined = type(DedupeResult.__name__, (DedupeResult, cls), {})
        _classes[cls] = combined
    return combined
