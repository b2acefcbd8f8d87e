"""Run the Lua scripts over a connection of each thread's own: the hot path of every call.

redis-py's ``Script.__call__`` goes through the client's full command path: a connection
checked out of the pool and back, instrumentation, response callbacks. On loopback that is
about as much time as the round trip itself. Scripts need none of it, so each thread keeps a
connection of its own (made from the pool's connection class and settings, so TLS, unix
sockets, auth and timeouts all carry over) and talks to it directly.

What the client path gave is kept: NOSCRIPT loads the script and sends it again (the server
lost its cache: a restart, a failover), and connection failures are retried with the
client's own ``Retry`` policy on a fresh connection (every script is idempotent per task id,
so a command sent twice is harmless).

:meth:`ScriptRunner.send` sends a call whose reply nobody waits for (a run's release: the
worker moves on to its next task at once). Only a script the server is known to hold goes
that way (else the call waits, and loads it): a NOSCRIPT reply read late would leave the
call undone until then. Replies are read, in order, before the next call on that connection;
a call refused with NOSCRIPT after all (a restart in between) is loaded and run then, and a
connection lost with calls in flight sends them again on its successor.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.connection import AbstractConnection
from redis.exceptions import NoScriptError, ResponseError
from redis.retry import Retry

__all__ = ["ScriptRunner", "pack_command"]

logger = logging.getLogger("dedupe.store")


def pack_command(*parts: Any, encoding: str = "utf-8") -> bytes:
    """RESP-encode a command of str, bytes, int and float parts (what scripts get).

    redis-py's general encoder costs more than the round trip's own Python work here.
    """
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        if isinstance(part, str):
            part = part.encode(encoding)
        elif isinstance(part, int):
            part = b"%d" % part
        elif isinstance(part, float):
            part = repr(part).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


class _Local(threading.local):
    connection: AbstractConnection | None = None
    pid: int = 0

    def __init__(self) -> None:
        #: Calls sent on ``connection`` whose replies are not read yet, oldest first.
        self.pending: deque[tuple[Script, bytes]] = deque()
        #: Calls sent on a connection that was lost before their replies came: send again.
        self.unsent: list[tuple[Script, bytes]] = []


class ScriptRunner:
    """Calls scripts registered on ``client`` with EVALSHA, one connection per thread."""

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._retry: Retry = client.get_retry() or Retry(NoBackoff(), 0)
        self._local = _Local()
        self._encoding = str(self._pool.connection_kwargs.get("encoding", "utf-8"))
        #: SHAs of scripts the server answered since the last lost connection.
        self._known: set[str] = set()

    def __call__(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run a script and return its reply."""
        command = self._pack(script, keys, args)
        return self._retry.call_with_retry(
            lambda: self._call(script, command), self._drop_connection
        )

    def send(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> None:
        """Run a script without waiting for its reply (read before the next call)."""
        if script.sha not in self._known:
            self(script, keys, args)
            return
        command = self._pack(script, keys, args)

        def send_now() -> None:
            connection = self._connection()
            self._catch_up(connection)
            self._send(connection, command)
            self._local.pending.append((script, command))

        self._retry.call_with_retry(send_now, self._drop_connection)

    def _pack(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
        return pack_command(
            b"EVALSHA", script.sha, len(keys), *keys, *args, encoding=self._encoding
        )

    def _call(self, script: Script, command: bytes) -> Any:
        connection = self._connection()
        self._catch_up(connection)
        self._send(connection, command)
        return self._reply(connection, script, command)

    def _catch_up(self, connection: AbstractConnection) -> None:
        """Resend what a lost connection took with it, then read the replies of sends."""
        local = self._local
        while local.unsent:
            script, command = local.unsent[0]
            self._send(connection, command)
            self._settle(connection, script, command)
            local.unsent.pop(0)
        while local.pending:
            script, command = local.pending[0]
            self._settle(connection, script, command)
            local.pending.popleft()

    def _settle(self, connection: AbstractConnection, script: Script, command: bytes) -> None:
        try:
            self._reply(connection, script, command)
        except ResponseError as exc:
            # Nobody waits for this reply: say so, and carry on with the caller's call.
            logger.warning("a script sent earlier failed: %r", exc)

    def _reply(self, connection: AbstractConnection, script: Script, command: bytes) -> Any:
        try:
            try:
                reply = connection.read_response()
            except NoScriptError:
                load = pack_command(b"SCRIPT", b"LOAD", script.script, encoding=self._encoding)
                self._send(connection, load)
                connection.read_response()
                self._send(connection, command)
                reply = connection.read_response()
            self._known.add(script.sha)
            return reply
        except ResponseError:
            raise  # a whole reply was read: the connection is in step
        except BaseException:
            # Anything else may leave a reply unread on the socket: never reuse it.
            self._drop_connection()
            raise

    @staticmethod
    def _send(connection: AbstractConnection, command: bytes) -> None:
        send: Any = connection.send_packed_command  # (untyped in redis-py)
        send([command], check_health=False)

    def _connection(self) -> AbstractConnection:
        local = self._local
        pid = os.getpid()
        connection = local.connection
        if connection is None or local.pid != pid:
            if local.pid != pid:
                # A forked child: its parent's connection and sends are not its own.
                # (redis-py only shuts a socket down in the process that opened it.)
                local.pending.clear()
                local.unsent.clear()
            connection = self._pool.connection_class(**self._pool.connection_kwargs)
            local.connection, local.pid = connection, pid
        return connection

    def _drop_connection(self, _error: BaseException | None = None) -> None:
        local = self._local
        connection, local.connection = local.connection, None
        # Calls in flight may not have reached Redis: send them again on the next one.
        local.unsent.extend(local.pending)
        local.pending.clear()
        self._known.clear()  # the server may have restarted, and lost its scripts
        if connection is not None:
            disconnect: Any = connection.disconnect  # (untyped in redis-py)
            disconnect()
