"""Lease renewal: one daemon thread per worker process renews the leases of its runs.

A run's key is held with a short lease (``unique_lease``, default 60 s) and renewed every
third of it, so a killed worker frees its keys within one lease. Under gevent or eventlet the
thread is a green thread: it renews as long as tasks yield to the hub; a task that blocks the
hub for longer than its lease loses its key (raise ``unique_lease`` for such tasks).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from dedupe.errors import RedisUnavailable
from dedupe.events import LEASE_LOST, RECREATED, emit
from dedupe.store.commands.leases import Lease
from dedupe.store.replies import Renewal
from dedupe.store.store import Store
from dedupe.values import defaults

__all__ = ["Heartbeat"]

logger = logging.getLogger("dedupe.heartbeat")

# How long an idle thread sleeps between looks. hold() wakes it only for a lease due before
# its next look: with the default 60 s lease (due in 20 s), starting a run never wakes it.
_IDLE_WAIT = 1.0


class Watch(Protocol):
    """What the heartbeat watches besides its leases (dedupe.recovery.unacked.RestartWatch)."""

    def __call__(self) -> None:
        """Look for a data loss of the dedup Redis, and restore after one (never raises)."""

    def changed(self) -> bool:
        """Was the data lost since the last look (a cheap look; never raises)?"""


@dataclass(eq=False)
class _Held:
    lease: Lease
    task_name: str
    due: float = field(default=0.0)

    def schedule(self) -> None:
        self.due = time.monotonic() + self.lease.lease_ms / 3000


class Heartbeat:
    """Renews the leases of the runs this process holds, in one round trip per beat."""

    def __init__(self, store: Store, watch: Watch | None = None, every: float = 1.0) -> None:
        self._store = store
        #: Called by the thread every ``every`` seconds once it runs, runs held or not (see
        #: dedupe.recovery.unacked.RestartWatch): a worker whose runs are all shorter than a third
        #: of their lease never beats.
        self._watch = watch
        self._watch_every = every
        self._reset()

    def _reset(self) -> None:
        # Also the state of a freshly forked child: no thread, no leases, fresh locks.
        self._pid = os.getpid()
        self._held: dict[int, _Held] = {}
        self._wake = threading.Condition()
        # Held while a beat talks to Redis, so that drop() returns only once no renewal of
        # the dropped lease is in flight: a late renewal would re-create a released key.
        self._renewing = threading.Lock()
        self._thread: threading.Thread | None = None
        #: When the thread next looks at its leases (monotonic; 0 while it renews).
        self._wake_at = 0.0
        #: When the thread next calls the watch (monotonic; one period after it starts, so
        #: that a run's own cost stays a claim and a release).
        self._watch_at = 0.0
        #: When the thread next asks the watch whether the data was lost (monotonic), while
        #: it holds the run lock of a unique_until="started" run: after a loss, such a run
        #: takes its lock back before the restore looks at it (its call key then stays free).
        self._look_at = 0.0

    def hold(self, lease: Lease, task_name: str = "") -> None:
        """Start renewing ``lease`` (of a run of ``task_name``, which events name)."""
        if self._pid != os.getpid():
            self._reset()
        held = _Held(lease, task_name)
        held.schedule()
        with self._wake:
            self._held[id(lease)] = held
            if self._thread is None or not self._thread.is_alive():
                self._watch_at = time.monotonic() + self._watch_every
                self._thread = threading.Thread(
                    target=self._run, name="dedupe-heartbeat", daemon=True
                )
                self._thread.start()
            elif held.due < self._wake_at:
                self._wake.notify()

    def drop(self, lease: Lease) -> None:
        """Stop renewing ``lease``; when this returns, no renewal of it is in flight."""
        if self._pid != os.getpid():
            return
        with self._renewing, self._wake:
            self._held.pop(id(lease), None)

    def holding(self) -> int:
        """How many leases this process renews now."""
        with self._wake:
            return len(self._held)

    def _run(self) -> None:
        while True:
            with self._wake:
                due = self._due()
                while not due and not self._watch_due() and not self._look_due():
                    next_due = self._next_due()
                    wake_at = next_due if next_due is not None else time.monotonic() + _IDLE_WAIT
                    if self._watch is not None:
                        wake_at = min(wake_at, self._watch_at)
                        if self._holds_run_locks():
                            wake_at = min(wake_at, self._look_at)
                    self._wake_at = wake_at
                    self._wake.wait(max(wake_at - time.monotonic(), 0))
                    due = self._due()
                self._wake_at = 0.0
                look = self._look_due()
            if look:
                assert self._watch is not None
                self._look_at = time.monotonic() + defaults.RESTORE_LOOK
                if self._watch.changed():
                    with self._wake:
                        locks = [held for held in self._held.values() if held.lease.call_key]
                    due = [*due, *(held for held in locks if held not in due)]
            if due:
                with self._renewing:
                    self._beat(due)
            if self._watch is not None and self._watch_due():
                self._watch_at = time.monotonic() + self._watch_every
                # Outside the locks: it may take a while, and drop() must not wait for it.
                try:
                    self._watch()
                except Exception:
                    # (The watch says what went wrong itself: this thread must go on.)
                    logger.exception("the heartbeat's watch failed")

    def _holds_run_locks(self) -> bool:
        # (Under self._wake: hold() and drop() change the leases from other threads.)
        return any(held.lease.call_key for held in self._held.values())

    def _look_due(self) -> bool:
        return (
            self._watch is not None
            and time.monotonic() >= self._look_at
            and self._holds_run_locks()
        )

    def _watch_due(self) -> bool:
        return self._watch is not None and time.monotonic() >= self._watch_at

    def _due(self) -> list[_Held]:
        now = time.monotonic()
        return [held for held in self._held.values() if held.due <= now]

    def _next_due(self) -> float | None:
        return min((held.due for held in self._held.values()), default=None)

    def _beat(self, due: list[_Held]) -> None:
        with self._wake:
            # Dropped while this beat waited for the lock: leave them be.
            due = [held for held in due if self._held.get(id(held.lease)) is held]
        if not due:
            return
        try:
            codes = self._store.renew([held.lease for held in due])
        except Exception as exc:
            # Keep trying at the next beat (a lease is renewed three times per period): an
            # unreachable Redis, or one that refuses for a while (BUSY, OOM, MISCONF), must
            # not end the thread that every run of this process relies on.
            reason = exc.cause if isinstance(exc, RedisUnavailable) else exc
            logger.warning("could not renew %d lease(s): %r", len(due), reason)
            for held in due:
                held.schedule()
            return
        for held, renewal in zip(due, codes, strict=True):
            lease = held.lease
            if renewal is Renewal.LOST:
                emit(LEASE_LOST, held.task_name, lease.task_id, lease.key)
                with self._wake:
                    self._held.pop(id(lease), None)
                continue
            if renewal is Renewal.RECREATED:
                emit(RECREATED, held.task_name, lease.task_id, lease.key)
            # (PENDING: a call is being published into the key; the next beat takes it back.)
            held.schedule()
