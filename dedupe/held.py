"""After the dedup Redis lost its data: the keys of the messages a worker holds, not started.

A worker holds messages it has received and not yet run: one prefetched for a free pool
slot, one waiting in the worker's timer for its eta or countdown (a deferred run's next try
among them, for up to ``dedupe_deferral_cap`` seconds). When the dedup Redis loses its data
(a restart without persistence, a failover to a replica that lacked it), their records go
with it, and every call made before such a message's next try is accepted: with
``unique_until="started"`` again after each run's start, one new call after another.

On a Redis broker the broker's unacked hash names them, and :mod:`dedupe.unacked` restores
them from there. Any other broker (RabbitMQ) keeps no list another process could read, so
the worker that holds them writes their records back itself: its main process keeps a
connection blocked on a list nobody writes (:func:`dedupe.keys.watch_keys`), which a restart
or a failover ends at once; when the server answers again as another run (its ``run_id``, or
the watch's own marker gone), each held message takes its place again with ``wait.lua``,
exactly as a deferred message does at its next try: the free key, or a place in the run
that holds it, or the key ahead of a call accepted since the loss (that call waits in it).

Messages that run already need nothing: their heartbeat re-creates their keys.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis
from celery.worker import state as worker_state
from celery.worker.request import Request

from .deferral import since_of
from .errors import RedisUnavailable
from .events import RESTORED, emit
from .header import KeyHeader
from .keys import watch_keys
from .liveness import HOST
from .record import pack_queued
from .store import Store, Wait
from .timing import milliseconds, seconds_until

__all__ = ["HeldMessage", "HeldWatch", "held_message", "held_requests"]

logger = logging.getLogger("dedupe.keys")

# A message of these modes holds its call's key until it runs; a throttle window's key is its
# window, which no message restores.
_HELD_MODES = ("finished", "started")

#: Seconds before the first look at a server that did not answer, doubled up to the cap: a
#: restart is over in well under a second, and calls decided meanwhile are the ones at risk.
_RETRY_FIRST = 0.02
_RETRY_CAP = 0.1


@dataclass(frozen=True, slots=True)
class HeldMessage:
    """A message a worker holds and has not started, with what its place needs."""

    task_name: str
    task_id: str
    header: KeyHeader
    #: Seconds until its eta or countdown (0: none, or passed).
    delay: float
    #: Its first deferral (unix seconds, ``dedupe.deferral.SINCE``), or 0.
    deferred_since: float


def held_requests(consumer: Any) -> list[Any]:
    """The requests a worker's consumer holds and has not started: reserved (waiting for a
    pool slot) and scheduled (in the timer, waiting for their eta or countdown).

    Read from another thread than the consumer's: Celery's sets are copied, and a copy the
    consumer changed meanwhile is made again.
    """
    active = set(_copied(worker_state.active_requests))
    held = {id(r): r for r in _copied(worker_state.reserved_requests) if r not in active}
    timer = getattr(consumer, "timer", None)
    for item in getattr(timer, "queue", ()) if timer is not None else ():
        entry = item[-1]
        args = getattr(entry, "args", None)
        if getattr(entry, "canceled", False) or not args:
            continue  # (a connection lost since: the broker delivers the message again)
        request = args[0]
        if isinstance(request, Request) and request not in active:
            held[id(request)] = request
    return list(held.values())


def _copied(items: Iterable[Any]) -> list[Any]:
    for _ in range(10):
        try:
            return list(items)
        except RuntimeError:  # (changed during the copy by the consumer's thread)
            continue
    return []


def held_message(request: Any, now: float, enable_utc: bool) -> HeldMessage | None:
    """What a held request's place needs; None for a message without our header (or of a
    throttle window, whose key is its window)."""
    headers = getattr(request, "request_dict", None) or {}
    header = KeyHeader.read(headers)
    if header is None or header.until not in _HELD_MODES:
        return None
    return HeldMessage(
        task_name=str(headers.get("task") or getattr(request, "name", "")),
        task_id=str(request.id),
        header=header,
        delay=seconds_until(headers.get("eta"), now, enable_utc=enable_utc),
        deferred_since=since_of(headers) or 0.0,
    )


class HeldWatch:
    """Watches the dedup Redis from a worker's main process, and gives the messages the
    worker holds their places again when the server comes back without its data."""

    def __init__(
        self,
        store: Store,
        client: redis.Redis,
        *,
        prefix: str,
        default_ttl: float,
        every: float,
        held: Callable[[], Iterable[Any]],
        enable_utc: bool,
    ) -> None:
        """``client``: a connection of the watch's own, no retries, its socket timeout
        longer than ``every`` (the longest wait between two looks); ``held``: the worker's
        held requests (:func:`held_requests`)."""
        self._store = store
        self._client = client
        self._idle, self._marker = watch_keys(prefix, f"{HOST}:{uuid.uuid4().hex[:12]}")
        self._default_ttl = default_ttl
        self._every = every
        self._held = held
        self._enable_utc = enable_utc
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._run: bytes = b""
        self._looked = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="dedupe-held-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        failures = 0
        alive_at = time.time()
        pending = False  # (a loss seen, whose restore has not finished yet)
        while not self._stopped.is_set():
            try:
                pending = self.lost() or pending
                if pending:
                    self.restore(alive_at)
                    pending = False
                failures = 0
                alive_at = time.time()
                self._client.blpop([self._idle], timeout=max(1, round(self._every)))
            except (redis.RedisError, RedisUnavailable):
                # (Down, or coming back: look again soon, for calls are decided meanwhile.)
                failures += 1
                self._stopped.wait(min(_RETRY_FIRST * 2 ** min(failures, 8), _RETRY_CAP))

    def lost(self) -> bool:
        """Did the server lose its data since the last look? (Never at the first.)"""
        ttl_ms = milliseconds(3 * self._every + 10)
        with self._client.pipeline(transaction=False) as pipe:
            pipe.set(self._marker, b"1", nx=True, px=ttl_ms)
            pipe.pexpire(self._marker, ttl_ms)
            pipe.info("server")
            created, _, info = pipe.execute(raise_on_error=False)
        if isinstance(created, Exception):
            raise created
        # (An ACL or a proxy may refuse INFO: the marker's absence alone then tells.)
        run = str(info.get("run_id", "")).encode() if isinstance(info, dict) else b""
        changed = bool(run) and bool(self._run) and run != self._run
        lost = self._looked and (bool(created) or changed)
        self._looked = True
        if run:
            self._run = run
        return lost

    def restore(self, alive_at: float) -> int:
        """Give each held message its place again; returns how many took a key. ``alive_at``:
        when the server was last seen with its data (a call accepted after it came after
        every held message)."""
        now = time.time()
        messages = [
            message
            for request in self._held()
            if (message := held_message(request, now, self._enable_utc)) is not None
        ]
        placed = 0
        for message in messages:
            since = min(filter(None, (message.deferred_since, alive_at)))
            eta = now + message.delay if message.delay else None
            record = pack_queued(message.task_id, since, eta)
            ttl = message.header.ttl if message.header.ttl is not None else self._default_ttl
            keys = message.header.keys
            reply = self._store.wait(
                keys, message.task_id, record, milliseconds(ttl + message.delay), since
            )
            if reply in (Wait.QUEUED, Wait.WAITS, Wait.AHEAD):
                placed += 1
                emit(RESTORED, message.task_name, message.task_id, keys.call)
        logger.warning(
            "the dedup Redis lost its data (it restarted or failed over): %d of the %d "
            "messages this worker holds took their keys again",
            placed,
            len(messages),
        )
        return placed
