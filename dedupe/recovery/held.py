"""After the dedup Redis lost its data: the keys of the messages a worker holds, not started.

A worker holds messages it has received and not yet run: one prefetched for a free pool
slot, one waiting in the worker's timer for its eta or countdown (a deferred run's next try
among them, for up to ``dedupe_deferral_cap`` seconds). When the dedup Redis loses its data
(a restart without persistence, a failover to a replica that lacked it), their records go
with it, and every call made before such a message's next try is accepted: with
``unique_until="started"`` again after each run's start, one new call after another.

Design notes: docs/design-notes.md, "dedupe.recovery.held".
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

from dedupe.compat.celery_private import copied
from dedupe.errors import RedisUnavailable
from dedupe.events import RESTORED, emit
from dedupe.store.commands.restorations import Restoration
from dedupe.store.replies import Restore, run_id_of
from dedupe.store.store import Store
from dedupe.values.header import KeyHeader
from dedupe.values.keys import watch_keys
from dedupe.values.record import HOST, RESTORED_MODES
from dedupe.values.timing import milliseconds, seconds_until

__all__ = ["HeldMessage", "HeldWatch", "held_message", "held_requests"]

logger = logging.getLogger("dedupe.keys")

#: Seconds before the first look at a server that did not answer, doubled up to the cap: a
#: restart is over in well under a second, and calls decided meanwhile are the ones at risk.
_RETRY_FIRST = 0.02
_RETRY_CAP = 0.1


@dataclass(frozen=True, slots=True)
class HeldMessage:
    """A message a worker holds and has not started, with what its record needs."""

    task_name: str
    task_id: str
    header: KeyHeader
    #: Seconds until its eta or countdown (0: none, or passed).
    delay: float


def held_requests(consumer: Any, *, started: bool = False) -> list[Any]:
    """The requests a worker's consumer holds and has not started: reserved (waiting for a
    pool slot), scheduled (in the timer, waiting for their eta or countdown) and rate-limited
    (in a task's token bucket). ``started``: the running ones too.

    Read from another thread than the consumer's: Celery's sets are copied, and a copy the
    consumer changed meanwhile is made again.
    """
    active = set(copied(worker_state.active_requests))
    held = {id(r): r for r in copied(worker_state.reserved_requests) if r not in active}
    timer = getattr(consumer, "timer", None)
    for item in getattr(timer, "queue", ()) if timer is not None else ():
        entry = item[-1]
        args = getattr(entry, "args", None)
        if args and not getattr(entry, "canceled", False):
            # (canceled: its connection was lost since; the broker delivers it again)
            held[id(args[0])] = args[0]
    for bucket in (getattr(consumer, "task_buckets", None) or {}).values():
        for item in copied(getattr(bucket, "contents", ())):
            request = item[0] if isinstance(item, tuple) and item else item  # (request, tokens)
            held[id(request)] = request
    requests = [r for r in held.values() if isinstance(r, Request) and r not in active]
    return requests + list(active) if started else requests


def held_message(request: Any, now: float, enable_utc: bool) -> HeldMessage | None:
    """What a held request's record needs; None for a message without our header, of a
    throttle window (whose key is its window), revoked, or expired: it will not run."""
    headers = getattr(request, "request_dict", None) or {}
    header = KeyHeader.read(headers)
    if header is None or header.until not in RESTORED_MODES:
        return None
    expires = headers.get("expires")
    if request.id in worker_state.revoked or (
        expires and not seconds_until(expires, now, enable_utc=enable_utc)
    ):
        return None
    return HeldMessage(
        task_name=str(headers.get("task") or getattr(request, "name", "")),
        task_id=str(request.id),
        header=header,
        delay=seconds_until(headers.get("eta"), now, enable_utc=enable_utc),
    )


class HeldWatch:
    """Watches the dedup Redis from a worker's main process, and writes back the records of
    the messages the worker holds when the server comes back without its data."""

    #: Seconds after a restore (each after the one before) at which the records of messages
    #: the worker no longer holds are withdrawn: a run that ended between the read of the
    #: held messages and the write (the main process learns of a start late).
    LOOKS = (0.0, 0.5, 1.0)

    def __init__(
        self,
        store: Store,
        client: redis.Redis,
        *,
        prefix: str,
        default_ttl: float,
        every: float,
        held: Callable[..., Iterable[Any]],
        enable_utc: bool,
    ) -> None:
        """``client``: a connection of the watch's own, no retries, its socket timeout
        longer than ``every`` (the longest wait between two looks); ``held``: the worker's
        held requests (:func:`held_requests`, with its ``started`` flag)."""
        self._store = store
        self._client = client
        self._idle, self._marker = watch_keys(prefix, f"{HOST}:{uuid.uuid4().hex[:12]}")
        self._default_ttl = default_ttl
        self._every = every
        self._held = held
        self._enable_utc = enable_utc
        self._stopped = threading.Event()
        self._run: bytes = b""
        self._looked = False

    def start(self) -> None:
        threading.Thread(target=self._watch, name="dedupe-held-watch", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        failures = 0
        pending = False  # (a loss seen, whose restore has not finished yet)
        said = ""
        while not self._stopped.is_set():
            try:
                pending = self.lost() or pending
                if pending:
                    self.restore()
                    pending = False
                failures = 0
                self._client.blpop([self._idle], timeout=max(1, round(self._every)))
            except (redis.ConnectionError, redis.TimeoutError, RedisUnavailable):
                # Down, or coming back: look again soon, for calls are decided meanwhile.
                failures += 1
                self._stopped.wait(min(_RETRY_FIRST * 2 ** min(failures, 8), _RETRY_CAP))
            except Exception as exc:
                # Refused (an ACL without the watch's keys, a read-only replica): it says the
                # same at every look, so say it once, and look at the usual pace.
                if repr(exc) != said:
                    said = repr(exc)
                    logger.warning("cannot watch the dedup Redis for a loss of its data: %r", exc)
                self._stopped.wait(self._every)

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
        run = run_id_of(info)
        changed = bool(run) and bool(self._run) and run != self._run
        lost = self._looked and (bool(created) or changed)
        self._looked = True
        if run:
            self._run = run
        return lost

    def restore(self) -> int:
        """Write back the records of the held messages (``restore.lua``: restored records,
        whose lease is over at once: each stands for a message that is not running, which
        its own run takes over, and a call accepted since the loss waits in it); then
        withdraw those of messages the worker no longer holds, try again those a call was
        being published into, and write back those it received since the first look (on
        their way to it at the loss: a deferred run's next try, a prefetch). Returns how
        many took a key (withdrawn or not)."""
        items = self._restorations()
        seen = set(items)
        placed: dict[str, Restoration] = {}
        took = 0
        for look in self.LOOKS:
            self._stopped.wait(look)
            now_held = {str(r.id) for r in self._held(started=True)}
            for item in [item for item in placed.values() if item.task_id not in now_held]:
                self._store.withdraw(item)
                del placed[item.task_id]
            if look:
                received = {t: e for t, e in self._restorations().items() if t not in seen}
                seen.update(received)
                items.update(received)
            items = {task_id: entry for task_id, entry in items.items() if task_id in now_held}
            replies = self._store.restore([item for _, item in items.values()])
            for (task_name, item), reply in zip(items.values(), replies, strict=True):
                if reply in (Restore.RESTORED, Restore.JOINED):
                    placed[item.task_id] = item
                    took += 1
                    emit(RESTORED, task_name, item.task_id, item.keys.call)
            items = {
                task_id: entry
                for (task_id, entry), reply in zip(items.items(), replies, strict=True)
                if reply is Restore.PENDING
            }
        logger.warning(
            "the dedup Redis lost its data (it restarted or failed over): %d messages this "
            "worker holds took their keys again (%d of them started since)",
            took,
            took - len(placed),
        )
        return took

    def _restorations(self) -> dict[str, tuple[str, Restoration]]:
        now = time.time()
        items = {}
        for request in self._held():
            message = held_message(request, now, self._enable_utc)
            if message is None:
                continue
            header = message.header
            ttl = header.ttl if header.ttl is not None else self._default_ttl
            eta = now + message.delay if message.delay else None
            # As long as its own record would live from now: until its eta, and its time to
            # live after that; its lease over at once (the message is not running).
            ttl_ms = milliseconds(ttl + message.delay)
            restoration = Restoration.of(header.keys, message.task_id, now, ttl_ms, 0, eta)
            items[message.task_id] = (message.task_name, restoration)
        return items
