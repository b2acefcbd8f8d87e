"""redis-py's private members that dedupe uses (see :mod:`dedupe.compat`).

Each member, and what is turned off without it: docs/design-notes.md, "dedupe.compat".
"""

from __future__ import annotations

import importlib
import importlib.util
import socket
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import AbstractBackoff, NoBackoff
from redis.retry import Retry

from .members import Members

__all__ = [
    "HEARS_PUSHES",
    "MEMBERS",
    "backoff_of",
    "buffered",
    "hear_pushes",
    "retried_errors",
    "retries_of",
    "socket_of",
]

MEMBERS = Members("redis-py")
_Connection: Any = redis.Connection  # (untyped in redis-py)
# Where a connection's parser takes the handler of invalidation pushes: redis-py 5.1 and newer
# name it for invalidations, 5.0 for every push.
_PUSH_HANDLER_SETTERS = ("set_invalidation_push_handler", "set_push_handler")


#: How a handler of pushes is set on a connection's parser.
PushSetter = Callable[[Callable[[list[object]], None]], object]


def _push_setter(connection: object) -> PushSetter | None:
    parser = getattr(connection, "_parser", None)
    for name in _PUSH_HANDLER_SETTERS:
        setter = getattr(parser, name, None)
        if callable(setter):
            found: PushSetter = setter
            return found
    return None


SEES_SOCKET: bool = MEMBERS.need(
    "redis.connection.AbstractConnection._sock",
    "the busy poll's look at the socket (it polls through can_read, a microsecond more)",
    lambda: "_sock" in vars(_Connection(host="127.0.0.1")),
)


def socket_of(connection: object) -> socket.socket | None:
    """The socket of a connection redis-py has connected (None: not to be had)."""
    sock: socket.socket | None = getattr(connection, "_sock", None) if SEES_SOCKET else None
    return sock


def _hiredis_reader(connection: object) -> Any:
    # (None with redis-py's own parser, or before the connection's handshake.)
    return getattr(getattr(connection, "_parser", None), "_reader", None)


def _reader_reports() -> bool:
    reader: Any = importlib.import_module("hiredis").Reader()  # (no type information)
    return hasattr(reader, "has_data")


# Without hiredis redis-py reads with its own parser, polled through can_read: nothing missing.
SEES_BUFFER: bool = importlib.util.find_spec("hiredis") is not None and MEMBERS.need(
    "redis._parsers.hiredis._HiredisParser._reader (hiredis's Reader.has_data)",
    "the busy poll's look at a reply read ahead (it polls through can_read)",
    _reader_reports,
)


def buffered(connection: object) -> bool | None:
    """Are bytes of a reply in the connection's parser already, read off the socket with an
    earlier one? None: cannot tell (redis-py's own parser)."""
    reader = _hiredis_reader(connection) if SEES_BUFFER else None
    if reader is None:
        return None
    return bool(reader.has_data())


def _resp3_parser() -> object:
    # (A connection switches to it as it says HELLO 3: before 5.1, only then.)
    from redis._parsers import _RESP3Parser

    parser: Any = _RESP3Parser  # (untyped in redis-py)
    return parser(socket_read_size=65536)


HEARS_PUSHES: bool = MEMBERS.need(
    "redis.connection.AbstractConnection._parser's push handler",
    "remembered duplicates (every duplicate is asked of Redis)",
    lambda: (
        _push_setter(_Connection(host="127.0.0.1", protocol=3))
        or _push_setter(type("Connected", (), {"_parser": _resp3_parser()})())
    ),
)


def hear_pushes(connection: object, hear: Callable[[list[object]], None]) -> bool:
    """Have ``hear`` called with each invalidation pushed on ``connection`` (between replies);
    False where redis-py gives no way to (then nothing may be tracked on it)."""
    setter = _push_setter(connection) if HEARS_PUSHES else None
    if setter is None:
        return False
    setter(hear)
    return True


_RETRY = "the client's retry policy as it is"
MEMBERS.need(
    "redis.retry.Retry._supported_errors, ._retries and ._backoff",
    _RETRY,
    lambda: {"_supported_errors", "_retries", "_backoff"} <= set(vars(Retry(NoBackoff(), 1))),
)
_DEFAULT_ERRORS = (redis.ConnectionError, redis.TimeoutError, TimeoutError)


def retried_errors(retry: Retry) -> tuple[type[BaseException], ...]:
    """The errors ``retry`` retries."""
    return tuple(getattr(retry, "_supported_errors", None) or _DEFAULT_ERRORS)


def retries_of(retry: Retry) -> int:
    """How many times ``retry`` tries again (``get_retries`` is newer than redis-py 5.0)."""
    get = getattr(retry, "get_retries", None)
    return int(get() if callable(get) else getattr(retry, "_retries", 0))


def backoff_of(retry: Retry) -> AbstractBackoff:
    """The backoff of ``retry`` (none: retried at once)."""
    return getattr(retry, "_backoff", None) or NoBackoff()
