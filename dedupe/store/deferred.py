"""Scripts sent now whose replies are read later (a run's release, a renewal: nobody waits for
them), and how they land.

A send writes a script and leaves its reply to the thread's next call, which reads it first;
a connection lost before that sends it again. A thread that makes no next call (it went on
to other work, or ended) would leave the write's fate unread: the sweeper reads those
replies while the process runs, :func:`land_all` as it exits. A forked child starts its
runners anew.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError, ResponseError

from .connections import TRUSTED_IDLE, ConnectionState, Reply, ThreadConnections
from .resp import Part

__all__ = ["DefersReads", "land_all"]

logger = logging.getLogger("dedupe.store")

#: Seconds between two looks of the sweeper for sends whose replies nobody read: a reply the
#: sending thread has not read within about twice this is read by the sweeper, and a send
#: the connection lost is sent again.
_SWEEP_EVERY = 0.1
#: Seconds the sweeper goes on sending again what a dead connection took, while the dedup
#: Redis cannot be reached; then it lets them go, with a warning: by then each record's own
#: ttl or lease decides (a provisional record's 20 s, a run's lease).
_GIVE_UP_AFTER = 30.0
#: Seconds the sweeper stays once nothing is owed: a thread started per send would cost more
#: than the send saves (a worker's every run ends with one).
_SWEEPER_STAYS = 10.0


#: Every runner, for the sends that must land before the process exits.
_runners: weakref.WeakSet[Any] = weakref.WeakSet()


def _forked() -> None:
    for runner in list(_runners):
        runner._after_fork()


os.register_at_fork(after_in_child=_forked)


@atexit.register
def land_all() -> None:
    """Land every runner's unread sends now, waiting for threads in a call: as the process
    exits (atexit; a pool process that leaves through ``os._exit`` calls it itself)."""
    for runner in list(_runners):
        runner.land(wait=True)


class DefersReads(ThreadConnections):
    """The sends of a script runner: written now, their replies read later (before the
    thread's next call, or by the sweeper). A runner runs its scripts itself
    (:meth:`__call__`): a send that cannot wait for the next call is a call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As :class:`~dedupe.store.connections.ThreadConnections`; the runner's sends land
        before the process exits (:func:`land_all`)."""
        super().__init__(*args, **kwargs)
        #: The connections that owe replies of sends (read by the sweeper, if their thread
        #: does not; a forked child starts with none, :meth:`_after_fork`).
        owing: set[ConnectionState] = set()
        self._owing = owing
        self._owing_lock = threading.Lock()
        #: A sweeper runs (it ends once nothing was owed for a while; a send starts another).
        self._sweeping = False
        #: When a connection last came to owe replies (time.monotonic()).
        self._owed_at = 0.0
        _runners.add(self)

    def __call__(
        self, script: Script, keys: Sequence[Part], args: Sequence[Part], *, resend: bool = True
    ) -> object:
        """Run a script and return its reply (the runner's own)."""
        raise NotImplementedError

    def _write(self, command: bytes, commands: int = 1) -> None:
        """Write ``command`` (``commands`` of them) on this thread's connection, behind what
        earlier sends owe (read first)."""
        local = self._local
        local.wrote = False
        self._connection()
        if local.pending or local.unsent:
            self._catch_up()
        local.wrote = True  # (its fate is the server's from here)
        self._send(command, commands)

    def send(
        self,
        script: Script,
        keys: Sequence[Part],
        args: Sequence[Part],
        *,
        reply: bool = False,
    ) -> Reply | None:
        """Run a script without waiting for its reply (read before the next call). With
        ``reply``, the reply is kept: :meth:`result` waits for it, later, on this thread."""
        slot = Reply() if reply else None
        local = self._local
        # (A send whose reply is kept is read later, and sent again if the connection died.)
        idle = time.monotonic() - local.used_at if slot is None else 0.0
        # On a connection idle past TRUSTED_IDLE, a send nobody reads the reply of could be lost
        # without a trace (a proxy's silent drop): it waits for its reply instead (one round
        # trip, once per idle spell: a release after a run longer than this).
        if script.sha not in self._known or idle > TRUSTED_IDLE:
            value = self(script, keys, args)
            if slot is not None:
                slot.settle(value, None)
            return slot
        command = self._pack(script, keys, args)

        def send_now() -> None:
            self._connection()
            if slot is None:
                self._catch_up()  # keeps what nobody waits for from piling up
            else:
                # Replies come back in order: the older ones are read with this one, later.
                self._resend_unsent()
            self._send(command)
            local.pending.append((script, command, slot))

        with local.lock:
            self._tried(send_now)
        if not local.owing:
            self._owe(local)
        return slot

    def flush(self, *, wait: bool = True) -> None:
        """Read the replies of this thread's sends now; a lost connection sends them again
        (under the Retry policy): what was sent is applied once this returns. ``wait=False``:
        only if a reply has arrived (or the connection closed); else they are read before
        this thread's next call, or by the sweeper."""
        local = self._local
        if not (local.pending or local.unsent):
            return
        with local.lock:
            if not wait and not local.unsent and not self._readable(local):
                return
            self._tried(self._read_owed)

    def _readable(self, local: ConnectionState) -> bool:
        """Has this connection a reply to read, or is it lost? Never waits."""
        connection = local.connection
        if connection is None or local.owed != len(local.pending):
            return True
        try:
            return bool(connection.can_read(0))
        except redis.RedisError:
            return True  # (the read finds out)

    def _read_owed(self) -> None:
        """Read the replies this thread's connection owes, sending again on a new one what
        a lost connection took."""
        self._connection()
        self._catch_up()

    def result(self, slot: Reply) -> object:
        """The reply of a :meth:`send` made with ``reply=True`` on this thread (waits for it;
        a connection lost meanwhile sends the command again, under the Retry policy)."""

        def read() -> None:
            if not slot.done:
                self._read_owed()

        with self._local.lock:
            self._tried(read)
        if not slot.done:
            # The sweeper gave the send up (Redis out of reach for _GIVE_UP_AFTER): its fate
            # is unknown, and a None would read as an answer.
            raise redis.ConnectionError("a script sent to the dedup Redis was given up unanswered")
        if slot.error is not None:
            raise slot.error
        return slot.value

    def _catch_up(self) -> None:
        """Resend what a lost connection took with it, then read the replies of sends."""
        local = self._local
        self._resend_unsent()
        while local.pending:
            script, command, slot = local.pending[0]
            if script is None:
                self._read_load()  # (a reload's SCRIPT LOAD, sent below)
            elif not self._settle(script, command, slot):
                # NOSCRIPT, with the replies of later sends still on their way: load the
                # script and send the call again behind them, where its reply will come.
                load = self._load_command(script)
                self._send(load)
                self._send(command)
                local.pending.append((None, load, None))
                local.pending.append((script, command, slot))
            local.pending.popleft()

    def _read_load(self) -> None:
        try:
            self._read()
        except ResponseError as exc:
            logger.warning("a script could not be loaded: %r", exc)
        except BaseException:
            self._drop_connection()
            raise

    def _resend_unsent(self) -> None:
        """Send again, in order, what a lost connection took with it (replies read later)."""
        local = self._local
        while local.unsent:
            self._send(local.unsent[0][1])  # on failure it stays unsent, for the next one
            local.pending.append(local.unsent.pop(0))

    def _settle(self, script: Script, command: bytes, slot: Reply | None) -> bool:
        """Read the reply of the oldest send. False: NOSCRIPT, and the replies of later
        sends follow it (the caller sends it again behind them)."""
        alone = len(self._local.pending) <= 1
        try:
            value = self._reply(script, command, reload=alone)
        except NoScriptError as exc:
            if not alone:
                return False
            _failed_send(slot, exc)
            return True
        except ResponseError as exc:
            _failed_send(slot, exc)
            return True
        if slot is not None:
            slot.settle(value, None)
        return True

    def land(self, *, wait: bool = False) -> None:
        """Read the replies every thread owes for its sends, or send them again on a new
        connection: those of threads that left them unread for a sweep (``wait``: all, as
        the process exits, waiting for a thread that is in a call)."""
        with self._owing_lock:
            owing = list(self._owing)
        now = time.monotonic()
        for local in owing:
            if not wait and now - local.used_at < _SWEEP_EVERY:
                continue  # (its thread is likely to read them itself, at its next call)
            if not local.lock.acquire(timeout=1.0 if wait else 0):
                continue
            try:
                if local.pending or local.unsent:
                    self._land(local, now)
                if not (local.pending or local.unsent):
                    with self._owing_lock:
                        self._owing.discard(local)
                        local.owing = False
            finally:
                local.lock.release()

    def _land(self, local: ConnectionState, now: float) -> None:
        # Read as that thread: every method of the runner works on the calling thread's
        # connection.
        threads = self._threads
        mine, threads.local = threads.local, local
        try:
            self._tried(self._read_owed)
            local.failing_since = 0.0
        except redis.RedisError as exc:
            if not local.failing_since:
                local.failing_since = now
                logger.warning("writes to the dedup Redis not landed yet, trying on: %r", exc)
            elif now - local.failing_since > _GIVE_UP_AFTER:
                dropped = len(local.pending) + len(local.unsent)
                self._drop_connection()
                local.unsent.clear()
                local.failing_since = 0.0
                logger.warning(
                    "%d writes to the dedup Redis given up after %g s (their keys' ttl or "
                    "lease frees them): %r",
                    dropped,
                    _GIVE_UP_AFTER,
                    exc,
                )
        finally:
            threads.local = mine

    def _owe(self, local: ConnectionState) -> None:
        """``local`` has sends whose replies are not read: the sweeper reads them if its
        thread does not."""
        with self._owing_lock:
            self._owing.add(local)
            local.owing = True
            self._owed_at = time.monotonic()
            if not self._sweeping:
                self._sweeping = True
                threading.Thread(
                    target=_sweep, args=(weakref.ref(self),), name="dedupe-sweeper", daemon=True
                ).start()

    def _after_fork(self) -> None:
        """In a forked child: the parent's sweeper is not here, and a lock it held at the fork
        would never be let go. The forking thread's connection is dropped at its next call."""
        self._owing_lock = threading.Lock()
        owing: set[ConnectionState] = set()
        self._owing, self._sweeping = owing, False
        local = self._threads.local
        if local is not None:
            local.lock = threading.RLock()
            local.owing, local.failing_since = False, 0.0
        super()._after_fork()

    def _swept(self) -> bool:
        """Has nothing been owed for a while? Then the sweeper ends (under the lock, so that
        a send made meanwhile starts the next one)."""
        with self._owing_lock:
            if self._owing or time.monotonic() - self._owed_at < _SWEEPER_STAYS:
                return False
            self._sweeping = False
            return True


def _failed_send(slot: Reply | None, exc: ResponseError) -> None:
    if slot is None:
        # Nobody waits for this reply: say so, and carry on with the caller's call.
        logger.warning("a script sent earlier failed: %r", exc)
    else:
        slot.settle(None, exc)


def _sweep(runner: weakref.ref[DefersReads]) -> None:
    """The sweeper: every _SWEEP_EVERY, land what threads left unread, until nothing is owed
    (it holds its runner weakly: a runner nobody uses is not kept alive by it)."""
    pause = threading.Event()  # (waits as time.sleep would, whatever patches that)
    while not pause.wait(_SWEEP_EVERY):
        alive = runner()
        if alive is None:
            return
        try:
            alive.land()
        except Exception:  # (a bug of ours must not end the sweeping for good)
            logger.exception("the dedup sweeper failed; it goes on")
        if alive._swept():
            return
        del alive
