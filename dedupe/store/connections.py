"""Each thread's connection of a script runner (or, under gevent, one checked out of a pool):
its state (what is in flight on it, what it remembers) and its use: opened with the client
pool's class and settings, written, read (a busy poll first), dropped, under the Retry policy
and the call budget. The sends whose replies are read later are :mod:`dedupe.store.deferred`'s;
the scripts run over it, :mod:`dedupe.store.script_runner`'s."""

from __future__ import annotations

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
from redis.exceptions import InvalidResponse, NoScriptError, ReadOnlyError, ResponseError
from redis.retry import Retry

from dedupe.compat.redis_private import buffered, retried_errors, socket_of

from .remembered import RememberedAnswers
from .resp import Part, pack_command, pack_parts

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "TRUSTED_IDLE",
    "ConnectionLocal",
    "ConnectionState",
    "Reply",
    "ThreadConnections",
    "Threads",
    "connection_cap",
    "forks",
]

logger = logging.getLogger("dedupe.store")


#: Connections a runner opens at most when its client's pool has no ``max_connections``
#: (redis-py 8's pools have 100 unless told otherwise; older ones none).
DEFAULT_MAX_CONNECTIONS = 50
# Older redis-py pools stand for "no limit" with this.
_UNLIMITED = 2**31


def connection_cap(pool: Any) -> int:
    """The client pool's ``max_connections`` if it has one, else the default."""
    limit = getattr(pool, "max_connections", None)
    if isinstance(limit, int) and 0 < limit < _UNLIMITED:
        return limit
    return DEFAULT_MAX_CONNECTIONS


#: After polls that ran out of budget, sleep for 1, 3, 7 ... up to this many calls before
#: polling again: a stray slow reply costs one call, a far Redis one poll in this many.
_RETRY_POLL_AFTER = 63
_T = TypeVar("_T")
#: A connection idle this long may have been closed by the server (its ``timeout``, whose
#: shortest is 1 s), a proxy or a restart. Its socket is looked at before its next write (a
#: server's close is seen there, no round trip); a send nobody reads the reply of waits for
#: it instead (:mod:`.deferred`: a proxy's silent drop is seen only by a reply).
TRUSTED_IDLE = 0.5
#: Forks seen by this process: a connection opened before the last one is its parent's.
#: (Counting forks costs nothing per call; asking os.getpid() is a system call each time.)
forks = 0


def _count_fork() -> None:
    global forks
    forks += 1


os.register_at_fork(after_in_child=_count_fork)


class Reply:
    """The reply of a script sent with ``send(..., reply=True)``, once read."""

    __slots__ = ("done", "error", "on", "value")

    #: The connection the command was sent on, under gevent or eventlet (green_pool.py): the
    #: reply is read there. (Left unset otherwise: a send on a thread's own costs nothing more.)
    on: ConnectionState

    def __init__(self) -> None:
        self.done = False
        self.value: object = None
        self.error: ResponseError | None = None

    def settle(self, value: Any, error: ResponseError | None) -> None:
        self.value, self.error, self.done = value, error, True


class ConnectionState:
    """One thread's connection and what is in flight on it. Only its thread uses it, under
    its ``lock``; the sweeper too, with the lock, once the thread leaves sends unread."""

    connection: AbstractConnection | None = None
    forks: int = -1
    #: Poll for replies before sleeping for them (False: never on this connection).
    poll: bool = False
    #: Looks at the connection's plain socket without a system call more than poll(2): how
    #: a lone reply is polled for (None: a TLS or cooperative socket, or none to be had).
    poller: Any = None
    #: The last command written was the only one owed, and its reply is not read yet.
    lone: bool = False
    #: Calls left before polling again (after a poll that ran out of budget).
    poll_skips: int = 0
    #: Polls in a row that ran out of budget.
    poll_misses: int = 0
    #: When this thread last used its connection (time.monotonic()).
    used_at: float = 0.0
    #: Seconds left of the call's budget, while a retry runs: caps the timeouts of the
    #: connection it opens (None: no retry running).
    cap: float | None = None
    #: The connection was opened with a retry's capped timeouts: replaced once idle.
    capped: bool = False
    #: Redis pushes this connection invalidations of the keys it reads behind CACHING YES.
    tracking: bool = False
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
        #: Calls sent on ``connection`` whose replies are not read yet, oldest first.
        #: (A script of None: the SCRIPT LOAD of a call sent again after NOSCRIPT.)
        self.pending: deque[tuple[Script | None, bytes, Reply | None]] = deque()
        #: Calls sent on a connection that was lost before their replies came: send again.
        self.unsent: list[tuple[Script | None, bytes, Reply | None]] = []


class Threads(threading.local):
    """Each thread's :class:`ConnectionState`."""

    local: ConnectionState | None = None


class ConnectionLocal(Protocol):
    """Where each thread finds its connection (:class:`Threads`; green_pool.py's for
    greenlets)."""

    local: ConnectionState | None


class ThreadConnections:
    """A script runner's connections: each thread's own, opened, written and read through
    redis-py's public connection methods, and dropped when out of step; a failed try goes on
    under the Retry policy within the call budget."""

    def __init__(
        self,
        client: redis.Redis,
        busy_poll: float = 0.0,
        budget: float = 0.0,
        retry: Retry | None = None,
    ) -> None:
        """``busy_poll``: seconds to poll for a reply before sleeping for it (0: never);
        ``budget``: seconds one call may take in all, retries included (0: no limit but the
        Retry policy's); ``retry``: that policy (default: the client's)."""
        self._pool = client.connection_pool
        self._remember_for = 0.0
        self._busy_poll = busy_poll
        self._budget = budget
        self._retry: Retry = retry or client.get_retry() or Retry(NoBackoff(), 0)
        #: The errors the policy retries.
        self._retried = retried_errors(self._retry)
        self._threads: ConnectionLocal = Threads()
        #: The connections threads hold (a thread's goes with it), at most ``_cap``: past
        #: it, a new thread shares one, each call under the connection's lock.
        self._cap = connection_cap(self._pool)
        self._states: weakref.WeakSet[ConnectionState] = weakref.WeakSet()
        self._states_lock = threading.Lock()
        self._shared = 0
        self._encoding = str(self._pool.connection_kwargs.get("encoding", "utf-8"))
        #: SHAs of scripts the server answered since the last lost connection.
        self._known: set[str] = set()
        #: The constant start of each (script, number of keys, number of args) command.
        self._heads: dict[tuple[str, int, int], bytes] = {}

    @property
    def _local(self) -> ConnectionState:
        """This thread's connection (the sweeper's: the one it reads for)."""
        local = self._threads.local
        if local is None:
            local = self._threads.local = self._new_threads_state()
        return local

    def poll_for(self, seconds: float) -> None:
        """Poll this long for a reply from now on (each connection opened from now on)."""
        self._busy_poll = seconds

    def _after_fork(self) -> None:
        """In a forked child: a lock a parent's thread held at the fork is never let go.
        (The parent's other threads' connections leave with their thread-locals.)"""
        self._states_lock = threading.Lock()

    def _new_threads_state(self) -> ConnectionState:
        """A new thread's connection: its own while fewer than the cap are held, else one
        it shares (the first threads keep theirs without a lock's wait between calls)."""
        with self._states_lock:
            states = list(self._states)
            if len(states) < self._cap:
                local = ConnectionState(self._remember_for)
                self._states.add(local)
                return local
            self._shared += 1
            return states[self._shared % len(states)]

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
        # (The first try began when it took its connection.)
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

        return self._retry.call_with_retry(again, self._drop_connection)

    def _pack(self, script: Script, keys: Sequence[Part], args: Sequence[Part]) -> bytes:
        shape = (script.sha, len(keys), len(args))
        head = self._heads.get(shape)
        if head is None:
            size = b"*%d\r\n" % (3 + len(keys) + len(args))
            head = pack_parts([size], (b"EVALSHA", script.sha, len(keys)), "ascii")
            self._heads[shape] = head
        return pack_parts([head], (*keys, *args), self._encoding)

    def _load_command(self, script: Script) -> bytes:
        return pack_command(b"SCRIPT", b"LOAD", script.script, encoding=self._encoding)

    def _reply(self, script: Script, command: bytes, *, reload: bool = True) -> object:
        """Read the reply of ``command``; on NOSCRIPT load the script and send it again
        (``reload``: nothing else is in flight behind it), else raise NoScriptError."""
        try:
            try:
                reply = self._read()
            except NoScriptError:
                if not reload:
                    raise
                self._local.reloads += 1
                self._send(self._load_command(script))
                self._read()
                self._send(command)
                reply = self._read()
            self._known.add(script.sha)
            return reply
        except ResponseError as exc:
            self._check_demoted(exc)
            raise  # a whole reply was read: the connection is in step
        except BaseException:
            # Anything else may leave a reply unread on the connection: never reuse it.
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

    def _read(self) -> object:
        """Read one reply (pushes between replies go to the connection's push handler);
        raise an error reply as redis-py's exception for it."""
        local = self._local
        connection = local.connection
        if connection is None:  # (dropped by a failed send)
            raise redis.ConnectionError("the connection to the dedup Redis was lost")
        if local.poll:
            self._poll(local, connection)
        try:
            reply = connection.read_response(disable_decoding=True)
        except ResponseError:
            local.owed, local.lone = local.owed - 1, False  # (an error reply, read whole)
            raise
        except InvalidResponse as exc:  # a reply redis-py cannot read: out of step for good
            raise redis.ConnectionError(f"unreadable reply from the dedup Redis: {exc}") from exc
        local.owed, local.lone = local.owed - 1, False
        return reply

    def _poll(self, local: ConnectionState, connection: AbstractConnection) -> None:
        """Poll for the reply, within the budget, so that the read after it need not sleep."""
        if local.poll_skips:
            local.poll_skips -= 1
            return
        ready = _ready(local, connection)
        if ready is None:
            return  # (read off the socket with an earlier reply: the read will not wait)
        deadline = time.perf_counter() + self._busy_poll
        while not ready(0):  # (a reply, or a closed connection: the read will not wait)
            if time.perf_counter() >= deadline:
                local.poll_misses = misses = min(local.poll_misses + 1, 6)
                local.poll_skips = min(2**misses - 1, _RETRY_POLL_AFTER)
                return
        local.poll_misses = 0

    def _send(self, command: bytes, commands: int = 1) -> None:
        local = self._local
        connection = local.connection
        if connection is None:
            raise redis.ConnectionError("the connection to the dedup Redis was lost")
        # Counted first: sendall runs signal handlers once the bytes are out, and one that
        # raises leaves a command sent that nobody reads.
        local.lone = local.owed == 0 and commands == 1
        local.owed += commands
        send: Any = connection.send_packed_command  # (untyped in redis-py)
        send((command,), check_health=False)  # (it takes a sequence of chunks)

    def _connection(self) -> AbstractConnection:
        """This thread's connection, in step (else replaced), opened if it has none."""
        local = self._local
        now = time.monotonic()
        idle, local.used_at = now - local.used_at, now
        connection = local.connection
        if connection is not None and local.forks == forks:
            if not _to_replace(local, connection, idle):
                return connection
            self._drop_connection()
        if local.forks != forks:
            # A forked child: its parent's connection and sends are not its own. (Left open:
            # redis-py only shuts a socket down in the process that opened it, and closing
            # our copy would not close the parent's.)
            local.connection, local.owed = None, 0
            local.pending.clear()
            local.unsent.clear()
            local.known.clear()
            local.forks = forks
        connection = self._open(self._settings(local))
        local.connection, local.owed, local.capped = connection, 0, local.cap is not None
        local.poll, local.poll_skips, local.poll_misses = self._busy_poll > 0, 0, 0
        local.poller = _poller(connection) if local.poll else None
        self._opened(connection)
        return connection

    def _settings(self, local: ConnectionState) -> dict[str, Any]:
        # One try per connect, no health check: the Retry policy above is the only one that
        # retries. redis-py's own would nest inside it (on a frozen Redis a call then blocked
        # for minutes instead of its few timeouts); and this connection is only ever used
        # right after a use, so a health check would only add a round trip.
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
        return settings

    def _open(self, settings: dict[str, Any]) -> AbstractConnection:
        connection: AbstractConnection = self._pool.connection_class(**settings)
        connect: Any = connection.connect  # (untyped in redis-py)
        connect()  # the handshake: TLS, AUTH, HELLO, SELECT, client name
        return connection

    def _opened(self, connection: AbstractConnection) -> None:
        """A new connection is this thread's (tracking.py starts tracking on it)."""

    def _drop_connection(self, _error: BaseException | None = None) -> None:
        local = self._local
        connection, local.connection, local.owed, local.capped = local.connection, None, 0, False
        # Invalidations sent to the lost connection are lost with it.
        local.known.clear()
        local.tracking = False
        # Calls in flight may not have reached Redis: send them again on the next one.
        local.unsent.extend(local.pending)
        local.pending.clear()
        self._known.clear()  # the server may have restarted, and lost its scripts
        if connection is not None:
            disconnect: Any = connection.disconnect  # (untyped in redis-py)
            disconnect()


def _ready(local: ConnectionState, connection: AbstractConnection) -> Callable[[int], Any] | None:
    """How to look whether a reply has come; None: bytes of it are in the parser already. The
    socket tells (a third of can_read's cost a look) where no byte of the reply can be in the
    parser's buffer: a lone command's, or one whose parser says it holds none."""
    poller: Any = local.poller
    if poller is not None and not local.lone:
        held = buffered(connection)
        if held:
            return None
        if held is None:
            poller = None
    ready: Callable[[int], Any] = poller.poll if poller is not None else connection.can_read
    return ready


def _poller(connection: AbstractConnection) -> object:
    # Only a plain stdlib socket: a TLS socket may hold decrypted bytes that poll(2) does not
    # see (can_read does), and a cooperative one must yield to other greenlets instead.
    sock = socket_of(connection)
    if sock is None or type(sock).__module__ != "socket":
        return None
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return poller


def _to_replace(local: ConnectionState, connection: AbstractConnection, idle: float) -> bool:
    """Must this thread's connection (``idle`` seconds since its last use) be replaced before
    its next write?

    - A call was cut short between a send and its reply: the replies are out of step.
    - A retry's: its timeouts were what that retry had left of the budget.
    - Idle past TRUSTED_IDLE, and the server closed it: written on, it would answer nothing,
      and a script that must not run twice would be reported as of unknown fate.
    """
    if local.owed != len(local.pending):
        logger.debug("a call was cut short between a send and its reply: reconnecting")
        return True
    if local.capped and local.cap is None and not local.pending:
        return True
    if idle > TRUSTED_IDLE and not local.owed and _closed_by_server(connection):
        logger.debug("the dedup Redis closed an idle connection: reconnecting")
        return True
    return False


def _closed_by_server(connection: AbstractConnection) -> bool:
    """Has the server closed this connection (nothing owed on it)? Looked at without a wait
    and without reading: a plain socket that reads as its end. (Another socket, TLS or a
    cooperative one, is not looked at: its first write after the close finds out.)"""
    poller: Any = _poller(connection) if hasattr(select, "poll") else None
    # (Polled first: a socket with a timeout waits that long in recv, MSG_DONTWAIT or not.)
    if poller is None or not poller.poll(0):
        return False  # (not a plain socket; or open, nothing to read)
    sock = socket_of(connection)
    assert sock is not None  # (_poller made a poller of it)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True  # (reset)
