"""RESP, the Redis wire format, as far as the scripts need it: commands of str, bytes, int and
float parts out. (Replies are read by redis-py's parser.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

__all__ = ["Part", "ScriptCall", "pack_command", "pack_parts"]

#: One part of a command: a script's key or argument (a subclass of these, such as a str
#: enum or an IntEnum, is sent as its base type).
Part: TypeAlias = "str | bytes | int | float"
#: The keys and the arguments of one script call.
ScriptCall: TypeAlias = "tuple[list[Part], list[Part]]"


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
