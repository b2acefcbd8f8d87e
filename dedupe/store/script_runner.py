"""Run the Lua scripts over a connection of each thread's own: the hot path of every call.

redis-py's ``Script.__call__`` goes through the client's full command path: a connection
checked out of the pool and back, instrumentation, its general command packer and reply
parser. On loopback that costs as much as the round trip itself, for every producer call and
every run. Scripts need none of it: each thread keeps a connection of its own, made and
handshaken by redis-py (from the pool's connection class and settings, so TLS, unix sockets,
auth, the database and timeouts all carry over), and then talks on its socket directly. The
scripts answer with an integer or a bulk string (an error at worst), so the reply reader here
is a few lines; errors are turned into redis-py's exception classes by redis-py's own table.

Design notes: docs/design-notes.md, "dedupe.store.script_runner".
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.connection import AbstractConnection
from redis.exceptions import NoPermissionError, NoScriptError, ReadOnlyError, ResponseError
from redis.retry import Retry

from dedupe.compat.redis_private import retried_errors, socket_of

from .remembered import RememberedAnswers
from .resp import CACHING_YES, TRACKING_ON, PushMessage, pack_command, pack_parts, parse

__all__ = ["Reply", "ScriptRunner", "Unanswered", "land_all"]

logger = logging.getLogger("dedupe.store")


#: After polls that ran out of budget, sleep in recv for 1, 3, 7 ... up to this many calls
#: before polling again: a stray slow reply costs one call, a Redis out of reach of the budget
#: one poll in this many.
_RETRY_POLL_AFTER = 63
# A connection idle this long may have been closed by the server (its `timeout`), a proxy or
# a restart, and a send nobody reads the reply of is lost on it without a trace: such a send
# waits for its reply instead (one round trip, once per idle spell: a release after a run
# longer than this). Redis's shortest idle timeout is 1 s.
_TRUSTED_IDLE = 0.5
#: Seconds between two looks of the sweeper for sends whose replies nobody read: a reply the
#: sending thread has not read within about twice this (it went on to other work, or ended)
#: is read by the sweeper, and a send the connection lost is sent again.
_SWEEP_EVERY = 0.1
#: Seconds the sweeper goes on sending again what a dead connection took, while the dedup
#: Redis cannot be reached; then it lets them go, with a warning: by then each record's own
#: ttl or lease decides (a provisional record's 20 s, a run's lease).
_GIVE_UP_AFTER = 30.0
#: Seconds the sweeper stays once nothing is owed: a thread started per send would cost more
#: than the send saves (a worker's every run ends with one).
_SWEEPER_STAYS = 10.0

_T = TypeVar("_T")

# A fork leaves the child its parent's sockets: the first call after a fork opens its own.
# (Counting forks costs nothing per call; asking os.getpid() is a system call each time.)
_forks = 0


def _forked() -> None:
    global _forks
    _forks += 1
    for runner in list(_runners):
        runner._after_fork()


os.register_at_fork(after_in_child=_forked)


class Unanswered(redis.RedisError):
    """A script that must not run twice was sent and its reply never came (a timeout, a lost
    connection): it may have run, so it is not sent again. Not retried by a Retry policy."""


class Reply:
    """The reply of a script sent with ``ScriptRunner.send(..., reply=True)``, once read."""

    __slots__ = ("done", "error", "on", "value")

    #: The connection the command was sent on, under gevent or eventlet (green_pool.py): the
    #: reply is read there. (Left unset otherwise: a send on a thread's own costs nothing more.)
    on: _Local

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None
        self.error: ResponseError | None = None

    def settle(self, value: Any, error: ResponseError | None) -> None:
        self.value, self.error, self.done = value, error, True


class _Local:
    """One thread's connection and what is in flight on it. Only its thread uses it, under
    its ``lock``; the sweeper too, with the lock, once the thread leaves sends unread."""

    connection: AbstractConnection | None = None
    sock: socket.socket | None = None
    forks: int = -1
    #: Polls ``sock`` for readiness without blocking; None: never poll this socket.
    poll: Any = None
    #: Calls left before polling again (after a poll that ran out of budget).
    poll_skips: int = 0
    #: Polls in a row that ran out of budget.
    poll_misses: int = 0
    #: When this thread last used its connection (time.monotonic()).
    used_at: float = 0.0
    #: Seconds left of the call's budget, while a retry runs: caps the timeouts of the
    #: connection it opens (None: no retry running).
    cap: float | None = None
    #: The connection's timeouts were capped: set back once the retry has its reply.
    capped: bool = False
    #: Redis pushes this connection invalidations of the keys it reads behind CACHING YES.
    tracking: bool = False
    #: Polls the tracking connection for pushes without waiting.
    hear: Any = None
    #: NOSCRIPT reloads on this thread (a reloaded call is sent again without CACHING YES).
    reloads: int = 0
    #: Replies owed on ``connection``: one more before each command is written, one less as
    #: each is read. Anything but ``len(pending)`` between calls means an exchange was cut
    #: short (an exception, a signal handler's included, between a send and its read): the
    #: next reply would be taken for another command's, so the connection is dropped.
    owed: int = 0
    #: The current call's command was written: its fate is the server's from then on.
    wrote: bool = False
    #: In the runner's set of connections with sends whose replies are owed.
    owing: bool = False
    #: When the sweeper first failed to land this connection's sends (0: it has not failed).
    failing_since: float = 0.0

    def __init__(self, remember_for: float) -> None:
        self.lock = threading.RLock()
        #: Remembered answers of tracked keys, until Redis says the key changed.
        self.known = RememberedAnswers(remember_for)
        #: Bytes received and not parsed yet (the start of the next reply).
        self.buffer = b""
        #: Calls sent on ``connection`` whose replies are not read yet, oldest first.
        #: (A script of None: the SCRIPT LOAD of a call sent again after NOSCRIPT.)
        self.pending: deque[tuple[Script | None, bytes, Reply | None]] = deque()
        #: Calls sent on a connection that was lost before their replies came: send again.
        self.unsent: list[tuple[Script | None, bytes, Reply | None]] = []


class _Threads(threading.local):
    local: _Local | None = None


class _Holder(Protocol):
    """Where each thread finds its connection (:class:`_Threads`; green_pool.py's for
    greenlets)."""

    local: _Local | None


#: Every runner, for the sends that must land before the process exits.
_runners: weakref.WeakSet[ScriptRunner] = weakref.WeakSet()


@atexit.register
def land_all() -> None:
    """Land every runner's unread sends now, waiting for threads in a call: as the process
    exits (atexit; a pool process that leaves through ``os._exit`` calls it itself)."""
    for runner in list(_runners):
        runner.land(wait=True)


class ScriptRunner:
    """Calls scripts registered on ``client`` with EVALSHA, one connection per thread."""

    #: One server holds every key: one script may decide many calls.
    spans_calls = True

    def __init__(
        self,
        client: redis.Redis,
        busy_poll: float = 0.0,
        budget: float = 0.0,
        retry: Retry | None = None,
        remember_for: float = 0.0,
    ) -> None:
        """``busy_poll``: seconds to poll for a reply before sleeping for it (0: never);
        ``budget``: seconds one call may take in all, retries included (0: no limit but the
        Retry policy's); ``retry``: that policy (default: the client's); ``remember_for``:
        the longest a tracked answer is remembered (0: track nothing, speak RESP2)."""
        self._pool = client.connection_pool
        self._remember_for = remember_for
        #: The server refused RESP3 or tracking: remember nothing.
        self._tracking_refused = False
        self._busy_poll = busy_poll
        self._budget = budget
        self._retry: Retry = retry or client.get_retry() or Retry(NoBackoff(), 0)
        #: The errors the policy retries.
        self._retried = retried_errors(self._retry)
        self._threads: _Holder = _Threads()
        #: The connections that owe replies of sends (read by the sweeper, if their thread
        #: does not; a forked child starts with none, :meth:`_after_fork`).
        self._owing: set[_Local] = set()
        self._owing_lock = threading.Lock()
        #: A sweeper runs (it ends once nothing was owed for a while; a send starts another).
        self._sweeping = False
        #: When a connection last came to owe replies (time.monotonic()).
        self._owed_at = 0.0
        _runners.add(self)
        self._encoding = str(self._pool.connection_kwargs.get("encoding", "utf-8"))
        #: SHAs of scripts the server answered since the last lost connection.
        self._known: set[str] = set()
        #: The constant start of each (script, number of keys, number of args) command.
        self._heads: dict[tuple[str, int, int], bytes] = {}

    @property
    def _local(self) -> _Local:
        """This thread's connection (the sweeper's: the one it reads for)."""
        local = self._threads.local
        if local is None:
            local = self._threads.local = _Local(self._remember_for)
        return local

    def __call__(
        self, script: Script, keys: Sequence[Any], args: Sequence[Any], *, resend: bool = True
    ) -> Any:
        """Run a script and return its reply. ``resend=False``: a script that must not run
        twice (it pushes a message): tried again only if it was not written, else
        :class:`Unanswered`."""
        command = self._pack(script, keys, args)
        call = self._call if resend else self._call_once
        with self._local.lock:
            try:
                return call(script, command)
            except self._retried as first:  # (the retry's closure made only when needed)
                return self._retrying(first, lambda: call(script, command))

    def _call_once(self, script: Script, command: bytes) -> Any:
        try:
            return self._call(script, command)
        except self._retried as exc:
            if self._local.wrote:
                raise Unanswered(f"no reply from the dedup Redis to a script sent ({exc})") from exc
            raise

    def command(self, attempt: Callable[[], _T]) -> _T:
        """``attempt()``: a command of the client itself, under the client's own retries."""
        return attempt()

    def _tried(self, attempt: Callable[[], _T]) -> _T:
        """``attempt()``, and under the Retry policy and the budget again if it fails."""
        try:
            return attempt()
        except self._retried as first:
            return self._retrying(first, attempt)

    def _retrying(self, first: BaseException, attempt: Callable[[], _T]) -> _T:
        """Go on after a failed first try under the Retry policy, with that failure as its
        first (the policy's count and backoff stay as configured), within the call's
        budget: each try's timeouts are capped by what is left of it, and a try that would
        start past it fails at once."""
        failures = [first]
        # (The first try began when it took its socket.)
        deadline = self._local.used_at + self._budget if self._budget else None

        def again() -> _T:
            if failures:
                raise failures.pop()
            local = self._local
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise redis.TimeoutError(
                        f"no reply from the dedup Redis within the call budget ({self._budget} s)"
                    )
                local.cap = left
            try:
                return attempt()
            finally:
                local.cap = None
                if local.capped:
                    local.capped = False
                    if local.sock is not None:
                        local.sock.settimeout(self._socket_timeout())

        return self._retry.call_with_retry(again, self._drop_connection)

    def call_many(
        self,
        script: Script,
        calls: Sequence[tuple[Sequence[Any], Sequence[Any]]],
        *,
        resend: bool = True,
    ) -> list[Any]:
        """Run ``script`` once per ``(keys, args)``, pipelined: one round trip for them all.
        The replies in order, an error reply as its exception in its place. A lost
        connection sends them all again (under the Retry policy), unless ``resend=False``
        (see :meth:`__call__`): the scripts answer a resent command as its first sending did
        while its key still holds what the first wrote."""
        with self._local.lock:
            return self._call_many(script, calls, resend)

    def _call_many(
        self, script: Script, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]], resend: bool
    ) -> list[Any]:
        replies: list[Any] = []
        if calls and script.sha not in self._known:
            # The first alone loads the script if the server lacks it (NOSCRIPT).
            replies.append(self._replied(script, calls[0], resend))
            calls = calls[1:]
        if not calls:
            return replies
        command = b"".join([self._pack(script, keys, args) for keys, args in calls])

        rest = self._tried(lambda: self._pipelined(command, len(calls), resend))
        for index, reply in enumerate(rest):
            if isinstance(reply, NoScriptError):  # flushed between the first and the rest
                rest[index] = self._replied(script, calls[index], resend)
        return replies + rest

    def _pipelined(self, command: bytes, count: int, resend: bool) -> list[Any]:
        """One try of :meth:`call_many`: ``count`` commands written at once, their replies
        read (an error reply in its place)."""
        sock = self._write(command, count)
        got: list[Any] = []
        try:
            for _ in range(count):
                try:
                    got.append(self._read(sock))
                except ResponseError as exc:  # read whole: the stream is in step
                    got.append(exc)
        except self._retried as exc:
            self._drop_connection()
            if not resend:
                raise Unanswered(f"no reply from the dedup Redis to scripts sent ({exc})") from exc
            raise
        except BaseException:
            self._drop_connection()
            raise
        for reply in got:
            if isinstance(reply, ResponseError):
                self._check_demoted(reply)
        return got

    def _replied(
        self, script: Script, call: tuple[Sequence[Any], Sequence[Any]], resend: bool
    ) -> Any:
        try:
            return self(script, *call, resend=resend)
        except ResponseError as exc:
            return exc

    def send(
        self, script: Script, keys: Sequence[Any], args: Sequence[Any], *, reply: bool = False
    ) -> Reply | None:
        """Run a script without waiting for its reply (read before the next call). With
        ``reply``, the reply is kept: :meth:`result` waits for it, later, on this thread."""
        slot = Reply() if reply else None
        local = self._local
        # (A send whose reply is kept is read later, and sent again if the connection died.)
        idle = time.monotonic() - local.used_at if slot is None else 0.0
        if script.sha not in self._known or idle > _TRUSTED_IDLE:
            value = self(script, keys, args)
            if slot is not None:
                slot.settle(value, None)
            return slot
        command = self._pack(script, keys, args)

        def send_now() -> None:
            sock = self._socket()
            if slot is None:
                self._catch_up(sock)  # keeps what nobody waits for from piling up
            else:
                # Replies come back in order: the older ones are read with this one, later,
                # often in the same recv.
                self._resend_unsent(sock)
            self._send(sock, command)
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
            if not wait and not local.unsent and not _readable(local.sock):
                return
            self._tried(self._read_owed)

    def _read_owed(self) -> None:
        """Read the replies this thread's connection owes, sending again on a new one what
        a lost connection took."""
        self._catch_up(self._socket())

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

    def _land(self, local: _Local, now: float) -> None:
        # Read as that thread: every method here works on the calling thread's connection.
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

    def _owe(self, local: _Local) -> None:
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
        self._owing, self._sweeping = set(), False
        local = self._threads.local
        if local is not None:
            local.lock = threading.RLock()
            local.owing, local.failing_since = False, 0.0

    def _swept(self) -> bool:
        """Has nothing been owed for a while? Then the sweeper ends (under the lock, so that
        a send made meanwhile starts the next one)."""
        with self._owing_lock:
            if self._owing or time.monotonic() - self._owed_at < _SWEEPER_STAYS:
                return False
            self._sweeping = False
            return True

    def result(self, slot: Reply) -> Any:
        """The reply of a :meth:`send` made with ``reply=True`` on this thread (waits for it;
        a connection lost meanwhile sends the command again, under the Retry policy)."""

        def read() -> None:
            if not slot.done:
                self._catch_up(self._socket())

        with self._local.lock:
            self._tried(read)
        if slot.error is not None:
            raise slot.error
        return slot.value

    def _pack(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
        shape = (script.sha, len(keys), len(args))
        head = self._heads.get(shape)
        if head is None:
            size = b"*%d\r\n" % (3 + len(keys) + len(args))
            head = pack_parts([size], (b"EVALSHA", script.sha, len(keys)), "ascii")
            self._heads[shape] = head
        return pack_parts([head], (*keys, *args), self._encoding)

    def _call(self, script: Script, command: bytes) -> Any:
        sock = self._write(command)
        return self._reply(sock, script, command)

    def _write(self, command: bytes, commands: int = 1) -> socket.socket:
        """Write ``command`` (``commands`` of them) on this thread's connection, behind what
        earlier sends owe (read first); the socket its replies come on."""
        local = self._local
        local.wrote = False
        sock = self._socket()
        if local.pending or local.unsent:
            self._catch_up(sock)
        local.wrote = True  # (its fate is the server's from here)
        self._send(sock, command, commands)
        return sock

    def call_tracked(
        self, script: Script, keys: Sequence[Any], args: Sequence[Any]
    ) -> tuple[Any, float | None]:
        """Run a script with Redis tracking the keys it reads for this thread (when the
        server can): its reply, and when it was sent (time.monotonic()) if the keys are
        tracked from then on, else None. :meth:`remember` keeps an answer made of it."""
        command = self._pack(script, keys, args)
        sent_at: list[float | None] = [None]
        local = self._local

        def attempt() -> Any:
            self._socket()  # (a new connection starts tracking here)
            if not local.tracking or script.sha not in self._known:
                sent_at[0] = None
                return self._call(script, command)
            reloads, sent_at[0] = local.reloads, time.monotonic()
            sock = self._write(CACHING_YES + command, 2)
            try:
                self._read(sock)  # +OK
            except ResponseError as exc:
                # The call goes on, untracked: an ACL that allows TRACKING but not CACHING
                # (for good), or an answer of the moment (BUSY, LOADING: this call only).
                sent_at[0] = None
                if _cannot_track(exc):
                    self._refuse_tracking(exc)
                    local.known.clear()
            except BaseException:
                self._drop_connection()
                raise
            reply = self._reply(sock, script, command)
            if local.reloads != reloads:
                sent_at[0] = None  # sent again after NOSCRIPT, untracked
            return reply

        with local.lock:
            return self._tried(attempt), sent_at[0]

    def remember(self, key: str, until: float, value: Any) -> None:
        """Keep ``value`` as this thread's answer for ``key`` until Redis says the key changed,
        or ``until`` (time.monotonic(); capped at ``remember_for`` from now). Only for a key a
        :meth:`call_tracked` just read, tracked."""
        local = self._local
        with local.lock:
            if local.tracking:
                local.known.keep(key.encode(self._encoding), until, value)

    def note_duplicate(self, key: str) -> None:
        """``key`` was met held (asked untracked): a duplicate of it again within
        ``remember_for`` is worth tracking (:meth:`worth_tracking`)."""
        local = self._local
        with local.lock:
            if local.tracking:
                local.known.keep(
                    key.encode(self._encoding), time.monotonic() + self._remember_for, None
                )

    def worth_tracking(self, key: str) -> bool:
        """Was ``key`` met held (or remembered) in this thread within ``remember_for``? Only
        such keys are tracked: Redis keeps every tracked key in its table until it changes,
        so the first meeting of a key asks untracked."""
        return self._local.known.is_fresh(key.encode(self._encoding))

    def remembered(self, key: str) -> Any:
        """This thread's remembered answer for ``key``, or None: Redis has said nothing of the
        key since it was remembered, and nothing waits to be read on the connection (bytes
        that do may be an invalidation's first part, or come before one still on its way:
        the call then asks, and its reply comes behind them)."""
        local = self._local
        known = local.known
        if not known:
            return None
        if local.forks != _forks:
            known.clear()  # the parent's memory, and its socket
            return None
        with local.lock:  # (the sweeper may read this connection too)
            answer = known.answer(key.encode(self._encoding))
            if answer is None:
                return None
            try:
                quiet = self._quiet()
            except redis.RedisError:
                self._drop_connection()
                return None
        return answer if quiet else None

    def forget(self, key: str) -> None:
        """Drop this thread's remembered answer for ``key`` (a write of this process's own)."""
        local = self._local
        with local.lock:
            local.known.drop(key.encode(self._encoding))

    def _quiet(self) -> bool:
        """Has the tracking connection nothing to read, and no reply owed to an earlier send?
        Never waits: what has arrived is read (pushes only), so what follows is the call's
        own round trip, under its own budget."""
        local = self._local
        sock = local.sock
        if sock is None or local.hear is None or local.owed != len(local.pending):
            local.known.clear()  # (no connection, or one cut short: it is dropped next)
            return False
        if local.pending or local.unsent or local.buffer:
            return False
        if not local.hear.poll(0):
            return True
        # Read it: pushes drop what they name, a closed connection is found now.
        local.buffer = self._receive(sock)
        while local.buffer:
            parsed = parse(local.buffer, 0)
            if parsed is None:
                break
            reply, end = parsed
            local.buffer = local.buffer[end:]
            if not isinstance(reply, PushMessage):
                # Nothing was sent whose reply this could be.
                raise redis.ConnectionError("the dedup Redis sent a reply out of turn")
            local.known.hear(reply)
        return False

    def _catch_up(self, sock: socket.socket) -> None:
        """Resend what a lost connection took with it, then read the replies of sends."""
        local = self._local
        self._resend_unsent(sock)
        while local.pending:
            script, command, slot = local.pending[0]
            if script is None:
                self._read_load(sock)  # (a reload's SCRIPT LOAD, sent below)
            elif not self._settle(sock, script, command, slot):
                # NOSCRIPT, with the replies of later sends still on their way: load the
                # script and send the call again behind them, where its reply will come.
                load = self._load_command(script)
                self._send(sock, load)
                self._send(sock, command)
                local.pending.append((None, load, None))
                local.pending.append((script, command, slot))
            local.pending.popleft()

    def _load_command(self, script: Script) -> bytes:
        return pack_command(b"SCRIPT", b"LOAD", script.script, encoding=self._encoding)

    def _read_load(self, sock: socket.socket) -> None:
        try:
            self._read(sock)
        except ResponseError as exc:
            logger.warning("a script could not be loaded: %r", exc)
        except BaseException:
            self._drop_connection()
            raise

    def _resend_unsent(self, sock: socket.socket) -> None:
        """Send again, in order, what a lost connection took with it (replies read later)."""
        local = self._local
        while local.unsent:
            entry = local.unsent[0]
            self._send(sock, entry[1])  # on failure it stays unsent, for the next connection
            local.pending.append(local.unsent.pop(0))

    def _settle(
        self, sock: socket.socket, script: Script, command: bytes, slot: Reply | None
    ) -> bool:
        """Read the reply of the oldest send. False: NOSCRIPT, and the replies of later
        sends follow it (the caller sends it again behind them)."""
        alone = len(self._local.pending) <= 1
        try:
            value = self._reply(sock, script, command, reload=alone)
        except NoScriptError as exc:
            if not alone:
                return False
            self._failed_send(slot, exc)
            return True
        except ResponseError as exc:
            self._failed_send(slot, exc)
            return True
        if slot is not None:
            slot.settle(value, None)
        return True

    @staticmethod
    def _failed_send(slot: Reply | None, exc: ResponseError) -> None:
        if slot is None:
            # Nobody waits for this reply: say so, and carry on with the caller's call.
            logger.warning("a script sent earlier failed: %r", exc)
        else:
            slot.settle(None, exc)

    def _reply(
        self, sock: socket.socket, script: Script, command: bytes, *, reload: bool = True
    ) -> Any:
        """Read the reply of ``command``; on NOSCRIPT load the script and send it again
        (``reload``: nothing else is in flight behind it), else raise NoScriptError."""
        try:
            try:
                reply = self._read(sock)
            except NoScriptError:
                if not reload:
                    raise
                self._local.reloads += 1
                load = self._load_command(script)
                self._send(sock, load)
                self._read(sock)
                self._send(sock, command)
                reply = self._read(sock)
            self._known.add(script.sha)
            return reply
        except ResponseError as exc:
            self._check_demoted(exc)
            raise  # a whole reply was read: the connection is in step
        except BaseException:
            # Anything else may leave a reply unread on the socket: never reuse it.
            self._drop_connection()
            raise

    def _check_demoted(self, exc: ResponseError) -> None:
        """A READONLY reply: a master demoted by a failover (Sentinel, a managed service),
        still connected, that will never take a write again. Drop the connection and raise
        a retried error: the retry reconnects, and a Sentinel-managed connection asks for
        the new master."""
        if isinstance(exc, ReadOnlyError) or str(exc).lstrip("-").startswith("READONLY"):
            self._local.wrote = False  # (refused, not run: it may be sent again)
            self._drop_connection()
            raise redis.ConnectionError(f"the dedup Redis is a replica now: {exc}") from exc

    def _read(self, sock: socket.socket) -> Any:
        """Read one reply: an integer, bytes, None or a list; raise an error reply."""
        local = self._local
        buffer = local.buffer
        while True:
            if buffer:
                parsed = parse(buffer, 0)
                if parsed is not None:
                    reply, end = parsed
                    buffer = local.buffer = buffer[end:]
                    if isinstance(reply, PushMessage):
                        local.known.hear(reply)  # out of band: not the reply of any call
                        continue
                    local.owed -= 1
                    if isinstance(reply, ResponseError):
                        raise reply
                    return reply
            if local.poll is not None:
                self._poll(local)
            buffer += self._receive(sock)

    @staticmethod
    def _receive(sock: socket.socket) -> bytes:
        """What the server sent next (waits for it), or redis-py's error for why not."""
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            raise redis.TimeoutError("Timeout reading from the dedup Redis") from None
        except OSError as exc:
            raise redis.ConnectionError(f"Error reading from the dedup Redis: {exc}") from exc
        if not chunk:
            raise redis.ConnectionError("The dedup Redis closed the connection")
        return chunk

    def _poll(self, local: _Local) -> None:
        """Poll for the reply, within the budget, so that the recv after it need not sleep."""
        if local.poll_skips:
            local.poll_skips -= 1
            return
        poll = local.poll.poll
        deadline = time.perf_counter() + self._busy_poll
        while not poll(0):  # readable, or hung up: either way recv will not wait
            if time.perf_counter() >= deadline:
                local.poll_misses = misses = min(local.poll_misses + 1, 6)
                local.poll_skips = min(2**misses - 1, _RETRY_POLL_AFTER)
                return
        local.poll_misses = 0

    def _send(self, sock: socket.socket, command: bytes, commands: int = 1) -> None:
        # Counted first: sendall runs signal handlers once the bytes are out, and one that
        # raises leaves a command sent that nobody reads.
        self._local.owed += commands
        try:
            sock.sendall(command)
        except TimeoutError:
            raise redis.TimeoutError("Timeout writing to the dedup Redis") from None
        except OSError as exc:
            raise redis.ConnectionError(f"Error writing to the dedup Redis: {exc}") from exc

    def _socket(self) -> socket.socket:
        local = self._local
        local.used_at = time.monotonic()
        sock = local.sock
        if sock is not None and local.forks == _forks:
            if local.owed == len(local.pending):
                return sock
            logger.debug("a call was cut short between a send and its reply: reconnecting")
            self._drop_connection()
        if local.forks != _forks:
            # A forked child: its parent's connection and sends are not its own. (Leave the
            # socket open: redis-py only shuts a socket down in the process that opened it,
            # and closing our copy would not close the parent's.)
            local.connection, local.sock, local.buffer, local.owed = None, None, b"", 0
            local.pending.clear()
            local.unsent.clear()
            local.known.clear()
            local.forks = _forks
        # One try per connect, no health check: the Retry policy above is the only one that
        # retries. redis-py's own would nest inside it (its connect retries, and before
        # redis-py 6 its handshake health-checked itself, recursively: on a frozen Redis a
        # call then blocked for minutes instead of its few timeouts). This socket is read and
        # written here, so redis-py never checks it after the handshake anyway.
        settings = {
            **self._pool.connection_kwargs,
            "health_check_interval": 0,
            "retry": Retry(NoBackoff(), 0),
        }
        # No wait may outlast the call's budget; a retry's, what is left of it.
        cap = local.cap if local.cap is not None else (self._budget or None)
        if cap is not None:
            for name in ("socket_timeout", "socket_connect_timeout"):
                configured = settings.get(name)
                settings[name] = cap if configured is None else min(configured, cap)
            local.capped = local.cap is not None
        track = self._remember_for > 0 and not self._tracking_refused
        if track:
            settings["protocol"] = 3  # pushes come on the connection itself
        connection = self._pool.connection_class(**settings)
        try:
            connection.connect()  # the handshake: TLS, AUTH, HELLO, SELECT, client name
        except ResponseError as exc:
            if not track or not _cannot_track(exc):
                raise
            # No HELLO 3 (Redis before 6, or a proxy): RESP2, and nothing remembered.
            self._refuse_tracking(exc)
            return self._socket()
        opened = socket_of(connection)
        if opened is None:
            raise redis.ConnectionError("redis-py gave a connection without a socket")
        local.connection, local.sock, local.buffer, local.owed = connection, opened, b"", 0
        local.poll, local.poll_skips, local.poll_misses = self._poller(opened), 0, 0
        local.tracking, local.hear = False, None
        if track and type(opened).__module__ == "socket":
            self._start_tracking(opened)
        return opened

    def _start_tracking(self, sock: socket.socket) -> None:
        # Only a plain stdlib socket: pushes are looked for with a poll, which neither sees
        # the bytes a TLS socket decrypted already nor suits a cooperative socket.
        local = self._local
        self._send(sock, TRACKING_ON)
        try:
            self._read(sock)
        except ResponseError as exc:
            self._refuse_tracking(exc)
            return
        except BaseException:
            self._drop_connection()
            raise
        hear = select.poll()
        hear.register(sock, select.POLLIN)
        local.tracking, local.hear = True, hear

    def _refuse_tracking(self, exc: ResponseError) -> None:
        """Track nothing on this connection; on the next ones too if the server cannot or
        may not (a Redis before 6, a proxy, an ACL), not for an answer of the moment."""
        self._local.tracking = False
        if self._tracking_refused or not _cannot_track(exc):
            return
        self._tracking_refused = True
        logger.info(
            "the dedup Redis cannot track keys for this client (%s): every duplicate is "
            "asked of Redis",
            exc,
        )

    def _socket_timeout(self) -> float | None:
        """The read timeout of a connection: the configured one, within the budget."""
        configured = self._pool.connection_kwargs.get("socket_timeout")
        if not self._budget:
            return configured
        return self._budget if configured is None else min(configured, self._budget)

    def _poller(self, sock: socket.socket) -> Any:
        # Only a plain stdlib socket: a TLS socket may hold decrypted bytes that poll does
        # not see, and gevent's or eventlet's sockets must yield to other greenlets instead.
        if self._busy_poll <= 0 or type(sock).__module__ != "socket":
            return None
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return poller

    def _drop_connection(self, _error: BaseException | None = None) -> None:
        local = self._local
        connection, local.connection, local.sock, local.buffer = local.connection, None, None, b""
        local.owed = 0
        # Invalidations sent to the lost connection are lost with it.
        local.known.clear()
        local.tracking, local.hear = False, None
        # Calls in flight may not have reached Redis: send them again on the next one.
        local.unsent.extend(local.pending)
        local.pending.clear()
        self._known.clear()  # the server may have restarted, and lost its scripts
        if connection is not None:
            disconnect: Any = connection.disconnect  # (untyped in redis-py)
            disconnect()


def _readable(sock: socket.socket | None) -> bool:
    """Has ``sock`` something to read (or was it closed)? Never waits."""
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):  # (closed meanwhile: the read finds out)
        return True
    return bool(readable)


def _sweep(runner: weakref.ref[ScriptRunner]) -> None:
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


def _cannot_track(exc: ResponseError) -> bool:
    """Does this refusal of HELLO 3, CLIENT TRACKING or CLIENT CACHING mean the server cannot
    or may not track keys for this client (rather than "not now")?"""
    text = str(exc).lstrip("-").lower()
    return isinstance(exc, NoPermissionError) or text.startswith(
        ("unknown command", "unknown subcommand", "err unknown", "noperm", "noproto")
    )
