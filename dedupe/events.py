"""What the dedup layer did to a key: a Celery signal per event, and a log line in the
event's family.

Every signal is sent with the task name as ``sender`` (as Celery's ``before_task_publish``
is) and these keyword arguments: ``task_name``, ``task_id`` (the id of this call or run),
``key`` (the Redis key) and ``holder`` (the [`Holder`][dedupe.Holder] that made a call a
duplicate or a run wait, else None); some add their own (listed on each). A receiver that
raises is logged by Celery and never fails the call or the run.

More, with examples: the docs' API reference, dedupe.events.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from celery.utils.dispatch import Signal

if TYPE_CHECKING:
    from .values.record import Holder

__all__ = [
    "EVENTS",
    "Event",
    "Observer",
    "call_accepted",
    "call_deduplicated",
    "emit",
    "key_reclaimed",
    "key_recreated",
    "key_released",
    "key_restored",
    "lease_lost",
    "redis_unavailable",
    "run_claimed",
    "run_deferred",
    "run_skipped",
    "set_observer",
]


def _signal(name: str, *extra: str) -> Signal:
    return Signal(
        name=f"dedupe.{name}", providing_args=["task_name", "task_id", "key", "holder", *extra]
    )


#: A call published its message and holds the key (``path``: how its record was written).
call_accepted = _signal("call_accepted", "path")
#: A call found its key held: nothing was published; ``holder`` is the task that holds it.
call_deduplicated = _signal("call_deduplicated")
#: A run claimed its key at start: it now holds it, under a heartbeat lease.
run_claimed = _signal("run_claimed")
#: A run found its key held by ``holder`` and was sent again for ``countdown`` seconds later;
#: ``deferral`` counts the deferrals of its message (the countdown doubles with each).
run_deferred = _signal("run_deferred", "countdown", "deferral")
#: A run found its key held by ``holder`` and was skipped (``on_running="skip"``).
run_skipped = _signal("run_skipped")
#: A run ended and freed its key.
key_released = _signal("key_released")
#: The pool's parent freed (or requeued, ``requeued=True``) the key of a run it lost,
#: revoked or killed.
key_reclaimed = _signal("key_reclaimed", "requeued")
#: A running task's heartbeat found another run holding its key: it stopped renewing it.
lease_lost = _signal("lease_lost")
#: A running task's heartbeat found its key gone (restart, failover, eviction) and wrote it.
key_recreated = _signal("key_recreated")
#: A worker found the dedup Redis's data lost and wrote back the key of a message the Redis
#: broker holds for a worker (reserved, running, or its worker dead and the message due back).
key_restored = _signal("key_restored")
#: The dedup Redis could not be asked; ``action`` says what happened instead ("published",
#: "raised", "ran unguarded", "not freed", "not requeued") and ``error`` why.
redis_unavailable = _signal("redis_unavailable", "action", "error")


@dataclass(frozen=True, slots=True)
class Event:
    """One kind of event: its name, signal, family's logger, level and log line."""

    name: str
    signal: Signal
    logger: logging.Logger
    level: int
    #: %-style with the signal's keyword arguments by name.
    message: str


_calls = logging.getLogger("dedupe.calls")
_runs = logging.getLogger("dedupe.runs")
_keys = logging.getLogger("dedupe.keys")
_redis = logging.getLogger("dedupe.redis")

ACCEPTED = Event(
    "call_accepted",
    call_accepted,
    _calls,
    logging.DEBUG,
    "%(task_name)s[%(task_id)s] published (%(path)s path)",
)
DEDUPLICATED = Event(
    "call_deduplicated",
    call_deduplicated,
    _calls,
    logging.INFO,
    "%(task_name)s: duplicate of %(holder_id)s (%(holder_state)s)",
)
CLAIMED = Event(
    "run_claimed", run_claimed, _runs, logging.DEBUG, "%(task_name)s[%(task_id)s] claimed %(key)s"
)
DEFERRED = Event(
    "run_deferred",
    run_deferred,
    _runs,
    logging.INFO,
    "%(task_name)s[%(task_id)s] waits: %(holder_id)s is %(holder_state)s "
    "(deferral %(deferral)d, tries again in %(countdown).1fs)",
)
SKIPPED = Event(
    "run_skipped",
    run_skipped,
    _runs,
    logging.INFO,
    "%(task_name)s[%(task_id)s] skipped: %(reason)s",
)
RELEASED = Event(
    "key_released", key_released, _keys, logging.DEBUG, "%(task_name)s[%(task_id)s] freed %(key)s"
)
RECLAIMED = Event(
    "key_reclaimed",
    key_reclaimed,
    _keys,
    logging.WARNING,
    "%(task_name)s[%(task_id)s]: the run was lost, revoked or killed; its key %(key)s was %(what)s",
)
LEASE_LOST = Event(
    "lease_lost",
    lease_lost,
    _keys,
    logging.WARNING,
    "lost the lease on %(key)s for task %(task_id)s: another run holds the key now; no longer "
    "renewing it",
)
RECREATED = Event(
    "key_recreated",
    key_recreated,
    _keys,
    logging.WARNING,
    "re-created %(key)s for running task %(task_id)s: the key was gone (Redis restarted, "
    "failed over or evicted it)",
)
RESTORED = Event(
    "key_restored",
    key_restored,
    _keys,
    logging.WARNING,
    "restored %(key)s for %(task_name)s[%(task_id)s], a message the broker holds for a worker: "
    "the key was gone (the dedup Redis lost its data)",
)
UNAVAILABLE = Event(
    "redis_unavailable",
    redis_unavailable,
    _redis,
    logging.WARNING,
    "%(task_name)s[%(task_id)s] %(action)s: dedup Redis unavailable: %(error)s",
)

#: Every event, by its signal's short name (``"call_accepted"``, ...).
EVENTS = {
    event.name: event
    for event in (
        ACCEPTED,
        DEDUPLICATED,
        CLAIMED,
        DEFERRED,
        SKIPPED,
        RELEASED,
        RECLAIMED,
        LEASE_LOST,
        RECREATED,
        RESTORED,
        UNAVAILABLE,
    )
}


def emit(
    event: Event,
    task_name: str,
    task_id: str,
    key: str,
    holder: Holder | None = None,
    **details: object,
) -> None:
    """Log ``event`` in its family and send its signal (a no-op when nobody listens and the
    level is off: it runs on every call)."""
    if event.logger.isEnabledFor(event.level):
        fields = {
            "task_name": task_name,
            "task_id": task_id,
            "key": key,
            "holder_id": holder.task_id if holder is not None else None,
            "holder_state": holder.state if holder is not None else None,
            "what": "requeued" if details.get("requeued") else "freed",
            **details,
        }
        event.logger.log(event.level, event.message, fields)
    if event.signal.receivers:
        event.signal.send(
            sender=task_name,
            task_name=task_name,
            task_id=task_id,
            key=key,
            holder=holder,
            **details,
        )
    observer = _observers.observer
    if observer is not None:
        try:
            if observer.listening():
                observer.observe(event, task_name, task_id, key, holder, details)
        except Exception:  # (an observer is no reason to fail a call or a run)
            logging.getLogger("dedupe").exception("an observer of %s failed", event.name)


class Observer(Protocol):
    """Told of every event while it listens (the web view's recorder: while a view runs).
    ``listening`` runs on every event: it answers from memory, and asks Redis rarely."""

    def listening(self) -> bool: ...

    def observe(
        self,
        event: Event,
        task_name: str,
        task_id: str,
        key: str,
        holder: Holder | None,
        details: dict[str, object],
    ) -> None: ...


class _Observers:
    # (No signal receiver: Celery's dispatch costs every event ~2.5 us, listening or not.)
    observer: Observer | None = None


_observers = _Observers()


def set_observer(observer: Observer | None) -> None:
    """Tell ``observer`` of every event while it listens (None: nobody)."""
    _observers.observer = observer
