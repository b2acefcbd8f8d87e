"""After the dedup Redis lost its data: the keys of the messages the Redis broker holds.

A worker's heartbeat re-creates the keys of its own live runs. A message whose worker was
killed before the loss has no heartbeat: on the Redis broker it stays unacked until the
visibility timeout gives it back, and with its key gone every call made meanwhile is
accepted, one after the other as each run ends. The broker still holds those messages (and
the reserved and running ones of every worker) in its ``unacked`` hash, with the producer's
key header: the first worker to notice the loss writes their records back (``restore.lua``).

Design notes: docs/design-notes.md, "dedupe.recovery.unacked".
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dedupe.compat import kombu_private
from dedupe.errors import RedisUnavailable
from dedupe.events import RESTORED, emit
from dedupe.store.commands.restorations import Restoration
from dedupe.store.replies import Restore
from dedupe.store.store import Store
from dedupe.values import defaults
from dedupe.values.header import KeyHeader
from dedupe.values.keys import alive_key
from dedupe.values.record import RESTORED_MODES
from dedupe.values.redelivery import redis_visibility

__all__ = ["AckFollower", "Ours", "RestartWatch", "restorations", "restore_unacked"]

logger = logging.getLogger("dedupe.keys")


class RestartWatch:
    """The :class:`~dedupe.store.commands.base.DataLossBarrier` of a store whose broker is a
    Redis of its own: restores the keys of the broker's unacked messages when the dedup Redis
    lost its data, before any call is decided there (the store asks with :attr:`marker`), and
    from the heartbeat thread every third of a lease (called: a worker with no calls to
    make)."""

    def __init__(
        self,
        app: Any,
        store: Store,
        prefix: str,
        lease: float,
        redelivery: float,
    ) -> None:
        self._app = app
        self._store = store
        self._prefix = prefix
        self.marker = alive_key(prefix)
        self._lease = lease
        self._redelivery = redelivery
        self._restoring: threading.Thread | None = None
        # One restore at a time in this process; the others wait for it, then find the marker.
        self._lock = threading.Lock()
        self._disarmed_until = 0.0
        #: The marker at the last look of changed().
        self._seen: bytes | None = None

    def armed(self) -> bool:
        """False for a third of a lease after a restore failed: calls are decided without
        the marker meanwhile (each would wait on a broker that failed it just now)."""
        return time.monotonic() >= self._disarmed_until

    def __call__(self) -> None:
        """Look at the marker, and restore in a thread if it is gone. Never raises: the
        heartbeat thread that calls it renews every run's lease."""
        if self._restoring is not None and self._restoring.is_alive():
            return
        try:
            if self._stale() is None:
                return
            # In a thread of its own: a broker that hangs must not stop the renewals.
            self._restoring = threading.Thread(
                target=self.restore, name="dedupe-restore", daemon=True
            )
            self._restoring.start()
        except RedisUnavailable:
            return  # (the heartbeat's own renewals say so)
        except Exception as exc:
            # Any other refusal (an ACL that leaves out the marker key or EXISTS) says the
            # same at every check: say it, and leave the renewals be.
            logger.warning("could not check for a dedup Redis data loss: %r", exc)

    def changed(self) -> bool:
        """Was the data lost since the last look (the marker gone, or set anew by a restore,
        here or in another process)? One GET: the heartbeat asks it every
        :data:`~dedupe.values.defaults.RESTORE_LOOK` seconds while it holds the run locks of
        ``unique_until="started"`` runs, which it then takes back at once (see
        :class:`_StartedLater`). Never raises (an unreachable Redis: no news)."""
        try:
            found = self._store.marker(self.marker)
        except Exception:
            return False
        seen, self._seen = self._seen, found
        return found is None or (seen is not None and found != seen)

    def _stale(self) -> bytes | None:
        """None while the marker stands for this run of the server (where the server does
        not say which run it is, while it is there); else the run to mark once restored."""
        found = self._store.marker(self.marker)
        run = self._store.server_run()
        # (The marker is "<run>/<restore>": each restore sets a new one, see changed().)
        if found is not None and (not run or found.split(b"/")[0] == run):
            return None
        return run or b"1"

    def restore(self) -> None:
        """Restore the keys of the unacked messages, then set the marker: the marker says a
        restore finished since the data was lost (calls decided before that are held back,
        not decided on keys that may be lost records). Never raises."""
        with self._lock:
            try:
                # (Read before the restore: a restart during it leaves a marker of a run
                # before it, which the next check restores over.)
                run = self._stale()
                if run is None:
                    return  # (restored by another thread or process meanwhile)
                restore_unacked(self._app, self._store, self._prefix, self._lease, self._redelivery)
                self._store.mark_alive(self.marker, run + b"/" + os.urandom(6).hex().encode())
            except Exception as exc:
                reason = exc.cause if isinstance(exc, RedisUnavailable) else exc
                logger.warning("could not restore the keys of unacked messages: %r", reason)
                # Calls go on without it; the next check (this process's or another's)
                # tries again.
                self._disarmed_until = time.monotonic() + self._lease / 3


def restore_unacked(app: Any, store: Store, prefix: str, lease: float, redelivery: float) -> int:
    """Write back the records of the messages the Redis broker holds unacked (of ``app``'s
    tasks and key prefix: a broker may serve other apps); withdraw those whose message was
    acked meanwhile (their run ended between the read and the write), now and, in a thread,
    for a second or two after (:class:`AckFollower`). Returns how many were restored now:
    of a ``unique_until="started"`` message, only its run lock is (its call key follows,
    :class:`_StartedLater`)."""
    # kombu's own channel: its client knows the broker's URL forms (Sentinel, sockets, TLS),
    # and the channel the names of the unacked hash and index.
    with app.connection_for_write() as connection:
        # One try: this runs inside a call, and kombu's default_channel would connect with
        # its retries (6 s with the broker down); a failed restore is tried again later.
        connection.ensure_connection(max_retries=0)
        channel = connection.default_channel
        messages = kombu_private.unacked_messages(channel)
        delivered = kombu_private.unacked_deliveries(channel)
        ours = Ours(prefix)
        items = restorations(messages, delivered, ours, time.time(), lease, redelivery)
        if not items:
            return 0
        visibility = redis_visibility(app)
        started = {tag: item for tag, item in items.items() if _started(item[1])}
        # A "started" message may be running: its run lock now (no run of its key beside
        # it), its call key once its worker had a few looks to take the lock back.
        store.restore_run_locks([item for _, item in started.values()])
        _withdraw_acked(channel, store, {tag: item for tag, (_, item) in started.items()})
        finished = {tag: item for tag, item in items.items() if tag not in started}
        restored = _restore_keys(channel, store, finished, delivered, visibility)
    if restored:
        _follow(app, store, restored)
    if started:
        later = _StartedLater(app, store, started, delivered, visibility)
        threading.Thread(target=later, name="dedupe-restore-started", daemon=True).start()
    return len(restored)


def _started(item: Restoration) -> bool:
    return item.keys.run != item.keys.call


def _restore_keys(
    channel: Any,
    store: Store,
    items: Mapping[bytes, tuple[str, Restoration]],
    delivered: Mapping[bytes, float],
    visibility: float,
) -> dict[bytes, tuple[Restoration, float]]:
    """Write back the records of ``items`` (delivery tag -> task name, restoration), withdraw
    those whose message was acked meanwhile; returns what stays restored, with until when
    a message gone from the unacked hash is surely acked (see :class:`AckFollower`)."""
    if not items:
        return {}
    tags = list(items)
    replies = store.restore([items[tag][1] for tag in tags])
    gone = _withdraw_acked(channel, store, {tag: items[tag][1] for tag in tags})
    restored: dict[bytes, tuple[Restoration, float]] = {}
    for tag, reply in zip(tags, replies, strict=True):
        task, item = items[tag]
        if tag not in gone and reply in (Restore.RESTORED, Restore.JOINED):
            # (Past half its visibility timeout, a message gone from the hash may be back
            # in its queue rather than acked: its record is left to its ttl.)
            restored[tag] = (item, delivered.get(tag, time.time()) + visibility / 2)
            emit(RESTORED, task, item.task_id, item.keys.call)
    return restored


def _follow(app: Any, store: Store, restored: Mapping[bytes, tuple[Restoration, float]]) -> None:
    # A run frees its key before its worker acks the message (acks_late: the pool's parent
    # acks once the child has reported): one that ended between the read and the write was
    # still unacked at the check above, and its restored record would hold the key of a
    # finished task until the record's ttl (the visibility timeout).
    follow = AckFollower(app, store, restored)
    threading.Thread(target=follow, name="dedupe-restore-follow", daemon=True).start()


class _StartedLater:
    """The call keys of ``unique_until="started"`` messages, restored
    :data:`~dedupe.values.defaults.STARTED_RESTORE_PAUSE` seconds after their run locks: a
    live run's heartbeat takes its run lock back meanwhile (it looks at the marker every
    :data:`~dedupe.values.defaults.RESTORE_LOOK` seconds), and restore.lua then leaves its
    call key alone. Calls made in the pause are accepted; each waits for the run lock."""

    def __init__(
        self,
        app: Any,
        store: Store,
        items: Mapping[bytes, tuple[str, Restoration]],
        delivered: Mapping[bytes, float],
        visibility: float,
    ) -> None:
        self._app, self._store, self._items = app, store, dict(items)
        self._delivered, self._visibility = dict(delivered), visibility

    def __call__(self) -> None:
        time.sleep(defaults.STARTED_RESTORE_PAUSE)
        try:
            with self._app.connection_for_write() as connection:
                connection.ensure_connection(max_retries=0)
                restored = _restore_keys(
                    connection.default_channel,
                    self._store,
                    self._items,
                    self._delivered,
                    self._visibility,
                )
        except Exception as exc:
            reason = exc.cause if isinstance(exc, RedisUnavailable) else exc
            logger.warning(
                "could not restore the call keys of %d unique_until='started' message(s), "
                "which their run locks hold off until their lease ends: %r",
                len(self._items),
                reason,
            )
            return
        if restored:
            AckFollower(self._app, self._store, restored)()


class AckFollower:
    """Withdraws the restored records whose messages are acked within a second or two of
    the restore (runs that ended during it), looking at :attr:`LOOKS`.

    Gone from the hash is taken for acked. A message requeued meanwhile (a reject with
    requeue, a worker's warm shutdown) is gone from it too, but back in its queue: its key
    would be withdrawn and one call let in, whose run the message's own then waits for. The
    looks are kept short for that: the worker's ack follows its run's release by
    milliseconds.
    """

    #: Seconds after the restore (each after the one before).
    LOOKS = (0.25, 0.5, 1.0)

    def __init__(
        self, app: Any, store: Store, restored: Mapping[bytes, tuple[Restoration, float]]
    ) -> None:
        """``restored``: delivery tag -> (what was restored, until when (``time.time()``)
        a message gone from the unacked hash is surely acked)."""
        self._app = app
        self._store = store
        self._left = dict(restored)

    def __call__(self) -> None:
        for wait in self.LOOKS:
            time.sleep(wait)
            now = time.time()
            self._left = {tag: held for tag, held in self._left.items() if now < held[1]}
            if not self._left:
                return
            try:
                with self._app.connection_for_write() as connection:
                    restored = {tag: item for tag, (item, _) in self._left.items()}
                    gone = _withdraw_acked(connection.default_channel, self._store, restored)
            except Exception as exc:
                reason = exc.cause if isinstance(exc, RedisUnavailable) else exc
                logger.warning(
                    "could not look for the acks of %d restored message(s), whose keys stay "
                    "until their records' ttl: %r",
                    len(self._left),
                    reason,
                )
                return  # (the broker or Redis away: the looks are seconds apart, not worth it)
            for tag in gone:
                del self._left[tag]


def _withdraw_acked(
    channel: Any, store: Store, restored: Mapping[bytes, Restoration]
) -> set[bytes]:
    """Withdraw the restored records (by delivery tag) whose messages are gone from the
    broker's unacked hash (acked); returns their tags."""
    tags = list(restored)
    if not tags:
        return set()
    present = kombu_private.unacked_present(channel, tags)
    gone = {tag for tag, value in zip(tags, present, strict=True) if value is None}
    for tag in gone:
        store.withdraw(restored[tag])
    return gone


@dataclass(frozen=True)
class Ours:
    """What tells the messages whose keys live in this store from other apps' on one broker:
    their key prefix. (Not the app's task names: a producer's app may know only the tasks it
    calls, and an app that shares the prefix shares the keys.)"""

    prefix: str

    def owns(self, task: str, header: KeyHeader) -> bool:
        """Is a message of ``task`` with ``header`` one whose key lives here?"""
        return header.keys.call.startswith(f"{self.prefix}:{{")


def restorations(
    messages: Mapping[bytes, bytes],
    delivered: Mapping[bytes, float],
    ours: Ours,
    now: float,
    lease: float,
    redelivery: float,
) -> dict[bytes, tuple[str, Restoration]]:
    """What to write back for kombu's unacked hash (delivery tag -> ``[message, exchange,
    routing key]`` as JSON) and index (tag -> delivery time): the unique ``"finished"`` and
    ``"started"`` messages in ``ours`` (task name, task id, header), each with its task name,
    held until the broker gives it back (``redelivery`` after its delivery) and a lease more."""
    items = {}
    lease_ms = max(int(lease * 1000), 1)
    for tag, value in messages.items():
        found = _message_key(value)
        if found is None:
            continue
        task, task_id, header = found
        if not ours.owns(task, header):
            continue
        at = delivered.get(tag, now)
        ttl_ms = max(int((at + redelivery + lease - now) * 1000), lease_ms)
        items[tag] = (task, Restoration.of(header.keys, task_id, at, ttl_ms, lease_ms))
    return items


def _message_key(value: bytes) -> tuple[str, str, KeyHeader] | None:
    # Its task name, task id and header; None for anything that is no Celery protocol 2
    # message with our header.
    try:
        message = json.loads(value)[0]
        headers = message["headers"]
        header = KeyHeader.read(headers)
        task, task_id = headers["task"], headers["id"]
    except (ValueError, LookupError, TypeError):
        return None
    if header is None or header.until not in RESTORED_MODES:
        return None
    if not isinstance(task, str) or not isinstance(task_id, str):
        return None
    return task, task_id, header
