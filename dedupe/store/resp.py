"""RESP, the Redis wire format, as far as the scripts need it: commands of str, bytes, int and
float parts out; integers, bulk strings, errors, nulls and arrays in, and RESP3's push
messages (the invalidations of tracked keys)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.exceptions import ResponseError

from dedupe.compat.redis_private import response_error

__all__ = ["CACHING_YES", "TRACKING_ON", "PushMessage", "pack_command", "pack_parts", "parse"]


def pack_command(*parts: Any, encoding: str = "utf-8") -> bytes:
    """RESP-encode a command of str, bytes, int and float parts (what scripts get).

    redis-py's general encoder costs more than the round trip's own Python work here.
    """
    return pack_parts([b"*%d\r\n" % len(parts)], parts, encoding)


def pack_parts(out: list[bytes], parts: Sequence[Any], encoding: str) -> bytes:
    for part in parts:
        kind = type(part)
        if kind is str:
            part = part.encode(encoding)
        elif kind is int:
            part = b"%d" % part
        elif kind is float:
            part = repr(part).encode()
        elif kind is not bytes:
            part = _other_part(part, encoding)
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


def _other_part(part: Any, encoding: str) -> bytes:
    # Subclasses (a str enum, an IntEnum, bool) as their base type: what redis-py sends.
    if isinstance(part, str):
        return str.encode(part, encoding)
    if isinstance(part, int):
        return b"%d" % part
    if isinstance(part, float):
        return repr(float(part)).encode()
    return bytes(part)


_CRLF = b"\r\n"
TRACKING_ON = pack_command(b"CLIENT", b"TRACKING", b"ON", b"OPTIN")
CACHING_YES = pack_command(b"CLIENT", b"CACHING", b"YES")


def parse(buffer: bytes, start: int) -> tuple[Any, int] | None:
    """Parse the RESP2/RESP3 reply at ``buffer[start:]``: (reply, end), or None if it has not
    all arrived. An error reply comes back as the redis-py exception to raise."""
    try:
        return _parse(buffer, start)
    except (ValueError, TypeError) as exc:  # (a length or number that is none, a map key)
        raise redis.ConnectionError(
            f"unreadable reply from the dedup Redis ({exc}): {buffer[start : start + 40]!r}"
        ) from exc


def _parse(buffer: bytes, start: int) -> tuple[Any, int] | None:
    line_end = buffer.find(_CRLF, start)
    if line_end < 0:
        return None
    kind = buffer[start : start + 1]
    line = buffer[start + 1 : line_end]
    end = line_end + 2
    if kind == b":":
        return int(line), end  # the scripts' most common reply: first
    simple = _SIMPLE.get(kind)
    if simple is not None:
        return simple(line), end
    if kind == b"$" or kind == b"!" or kind == b"=":
        return _parse_bulk(buffer, kind, int(line), end)
    if kind in _AGGREGATES:
        return _parse_aggregate(buffer, kind, int(line), end)
    if kind == b"|":
        # Attributes (RESP3): side information that precedes a reply; the reply is what counts.
        attributes = _parse_aggregate(buffer, b"%", int(line), end)
        return None if attributes is None else _parse(buffer, attributes[1])
    # No RESP kind at all: the stream cannot be trusted any more.
    raise redis.ConnectionError(f"unexpected reply from the dedup Redis: {buffer[:40]!r}")


def _parse_bulk(buffer: bytes, kind: bytes, size: int, end: int) -> tuple[Any, int] | None:
    if size < 0:
        return None, end
    if len(buffer) < end + size + 2:
        return None
    data = buffer[end : end + size]
    if kind == b"!":
        return _error(data), end + size + 2
    # (A verbatim string starts with its format: "txt:", "mkd:".)
    return (data[4:] if kind == b"=" else data), end + size + 2


# Aggregate kinds: array, push, set, map (a map's count is of pairs).
_AGGREGATES = frozenset({b"*", b">", b"~", b"%"})


def _parse_aggregate(buffer: bytes, kind: bytes, count: int, end: int) -> tuple[Any, int] | None:
    if count < 0:
        return None, end  # (a RESP2 null array)
    items: list[Any] = PushMessage() if kind == b">" else []
    for _ in range(count * 2 if kind == b"%" else count):
        parsed = _parse(buffer, end)
        if parsed is None:
            return None
        item, end = parsed
        items.append(item)
    if kind == b"%":
        return dict(zip(items[::2], items[1::2], strict=True)), end
    return items, end


class PushMessage(list[Any]):
    """A RESP3 push message: something the server says of its own accord."""


def _error(message: bytes) -> ResponseError:
    return response_error(message.decode("utf-8", "replace"))


# Replies that are one line: simple string, error, null, boolean, double, big number.
_SIMPLE: dict[bytes, Callable[[bytes], Any]] = {
    b"+": bytes,
    b"-": _error,
    b"_": lambda line: None,
    b"#": lambda line: line == b"t",
    b",": float,
    b"(": int,
}
