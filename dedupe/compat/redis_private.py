"""redis-py's private members that dedupe uses (see :mod:`dedupe.compat`).

Each member, and what is turned off without it: docs/design-notes.md, "dedupe.compat".
"""

from __future__ import annotations

import socket
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.exceptions import (
    NoPermissionError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
)
from redis.retry import Retry

from .members import Members

__all__ = [
    "FAST_CLIENT",
    "MEMBERS",
    "backoff_of",
    "response_error",
    "retried_errors",
    "retries_of",
    "socket_of",
]

MEMBERS = Members("redis-py")
_Connection: Any = redis.Connection  # (untyped in redis-py)

FAST_CLIENT: bool = MEMBERS.need(
    "redis.connection.AbstractConnection._sock",
    "the store's own client",
    lambda: "_sock" in vars(_Connection(host="127.0.0.1")),
)


def socket_of(connection: Any) -> socket.socket | None:
    """The socket of a connection redis-py has connected (handshake done)."""
    sock: socket.socket | None = getattr(connection, "_sock", None)
    return sock


try:
    from redis._parsers import BaseParser

    _parse_error: Any = BaseParser.parse_error  # (untyped in redis-py)
except (ImportError, AttributeError):
    _parse_error = None
MEMBERS.need(
    "redis._parsers.BaseParser.parse_error",
    "redis-py's table of error replies",
    lambda: _parse_error,
)

# The error replies the scripts and their handshake can meet, by their first word.
_ERRORS: dict[str, type[ResponseError]] = {
    "NOSCRIPT": NoScriptError,
    "READONLY": ReadOnlyError,
    "NOPERM": NoPermissionError,
}


def response_error(message: str) -> ResponseError:
    """The redis-py exception of an error reply (``message`` without its ``-``)."""
    if _parse_error is not None:
        error: ResponseError = _parse_error(message)
        return error
    code, _, rest = message.partition(" ")
    kind = _ERRORS.get(code)
    return kind(rest) if kind is not None else ResponseError(message)


_RETRY = "the client's retry policy as it is"
MEMBERS.need(
    "redis.retry.Retry._supported_errors, ._retries and ._backoff",
    _RETRY,
    lambda: {"_supported_errors", "_retries", "_backoff"} <= set(vars(Retry(NoBackoff(), 1))),
)
_DEFAULT_ERRORS = (redis.ConnectionError, redis.TimeoutError, TimeoutError)


def retried_errors(retry: Any) -> tuple[type[BaseException], ...]:
    """The errors ``retry`` retries."""
    return tuple(getattr(retry, "_supported_errors", None) or _DEFAULT_ERRORS)


def retries_of(retry: Any) -> int:
    """How many times ``retry`` tries again (``get_retries`` is newer than redis-py 5.0)."""
    get = getattr(retry, "get_retries", None)
    return int(get() if callable(get) else getattr(retry, "_retries", 0))


def backoff_of(retry: Any) -> Any:
    """The backoff of ``retry`` (none: retried at once)."""
    return getattr(retry, "_backoff", None) or NoBackoff()
