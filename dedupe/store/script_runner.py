"""Run the Lua scripts over a redis-py connection of each thread's own: every call's hot path.

redis-py's ``Script.__call__`` takes the client's full command path (a pooled connection
checked out and back, instrumentation, the general packer): on loopback as much as the round
trip itself. Here each thread keeps a redis-py ``Connection`` of its own, made from the pool's
class and settings (TLS, unix sockets, auth, the database, timeouts), and uses its public
methods: ``send_packed_command``, ``can_read``, ``read_response`` (redis-py's parser reads
every reply kind, hiredis's where installed). Kept on top, as measured to pay: the cached
packer, a busy poll for the reply, sends read later, NOSCRIPT reloads, the call budget, and a
guard for replies owed.

Design notes: docs/design-notes.md, "dedupe.store.script_runner".
"""

from __future__ import annotations

import logging
import select
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.connection import AbstractConnection
from redis.exceptions import InvalidResponse, NoScriptError, ReadOnlyError, ResponseError
from redis.retry import Retry

from dedupe.compat.redis_private import retried_errors, socket_of

from . import deferred
from .connection_state import ConnectionState, Holder, Threads, connection_cap
from .deferred import DefersReads, Reply, land_all
from .resp import pack_command, pack_parts
from .runner import RemembersNothing

__all__ = ["Reply", "ScriptRunner", "Unanswered", "land_all"]

logger = logging.getLogger("dedupe.store")

#: After polls that ran out of budget, sleep for 1, 3, 7 ... up to this many calls before
#: polling again: a stray slow reply costs one call, a far Redis one poll in this many.
_RETRY_POLL_AFTER = 63
_T = TypeVar("_T")


class Unanswered(redis.RedisError):
    """A script that must not run twice was sent and its reply never came (a timeout, a lost
    connection): it may have run, so it is not sent again. Not retried by a Retry policy."""


class ScriptRunner(RemembersNothing, DefersReads):
    """Calls scripts registered on ``client`` with EVALSHA, one connection per thread.
    (tracking.py's runner also remembers answers.)"""

    #: One server holds every key: one script may decide many calls.
    spans_calls = True

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
        self._threads: Holder = Threads()
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
        self._start_landing()

    @property
    def _local(self) -> ConnectionState:
        """This thread's connection (the sweeper's: the one it reads for)."""
        local = self._threads.local
        if local is None:
            local = self._threads.local = self._new_threads_state()
        return local

    def _after_fork(self) -> None:
        super()._after_fork()
        # (A parent's thread may have held it at the fork. The parent's other threads'
        # connections leave the weak set by themselves: their thread-locals go in the child.)
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
        self._write(command, count)
        got: list[Any] = []
        try:
            for _ in range(count):
                try:
                    got.append(self._read())
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

    def _pack(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
        shape = (script.sha, len(keys), len(args))
        head = self._heads.get(shape)
        if head is None:
            size = b"*%d\r\n" % (3 + len(keys) + len(args))
            head = pack_parts([size], (b"EVALSHA", script.sha, len(keys)), "ascii")
            self._heads[shape] = head
        return pack_parts([head], (*keys, *args), self._encoding)

    def _call(self, script: Script, command: bytes) -> Any:
        self._write(command)
        return self._reply(script, command)

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

    def _load_command(self, script: Script) -> bytes:
        return pack_command(b"SCRIPT", b"LOAD", script.script, encoding=self._encoding)

    def _reply(self, script: Script, command: bytes, *, reload: bool = True) -> Any:
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

    def _read(self) -> Any:
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
        # A lone command's reply: none of its bytes can be in the parser's buffer yet, so the
        # socket tells (a third of can_read's cost a look).
        poller = local.poller if local.lone else None
        ready = poller.poll if poller is not None else connection.can_read
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
        local.used_at = time.monotonic()
        connection = local.connection
        if connection is not None and local.forks == deferred.forks:
            if local.owed != len(local.pending):
                logger.debug("a call was cut short between a send and its reply: reconnecting")
                self._drop_connection()
            elif local.capped and local.cap is None and not local.pending:
                self._drop_connection()  # (a retry's: its timeouts were what it had left)
            else:
                return connection
        if local.forks != deferred.forks:
            # A forked child: its parent's connection and sends are not its own. (Left open:
            # redis-py only shuts a socket down in the process that opened it, and closing
            # our copy would not close the parent's.)
            local.connection, local.owed = None, 0
            local.pending.clear()
            local.unsent.clear()
            local.known.clear()
            local.forks = deferred.forks
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


def _poller(connection: AbstractConnection) -> Any:
    # Only a plain stdlib socket: a TLS socket may hold decrypted bytes that poll(2) does not
    # see (can_read does), and a cooperative one must yield to other greenlets instead.
    sock = socket_of(connection)
    if sock is None or type(sock).__module__ != "socket":
        return None
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return poller
