"""The latest arguments of a debounced or replacing call, as kept in Redis.

A broker message cannot be edited, so a duplicate of a debounced call (``debounce=``) or of
a call with ``on_duplicate="replace"`` leaves its arguments, serialised as Celery would
serialise them (the task's serializer), in the hash beside the call's record
(:attr:`~dedupe.values.keys.CallKeys.latest`, one field per task id). The holder's run takes
them as it starts. Nothing is kept for any other mode.

>>> body = pack_arguments((1, "a"), {"b": 2}, "json")
>>> unpack_arguments(body)
([1, 'a'], {'b': 2})
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgpack
from kombu.serialization import dumps, loads, prepare_accept_content

__all__ = ["Latest", "LatestWrite", "pack_arguments", "unpack_arguments"]


def pack_arguments(
    args: Iterable[object] | None, kwargs: Mapping[str, object] | None, serializer: str
) -> bytes:
    """``(args, kwargs)`` serialised with ``serializer`` (kombu's registry, as Celery's
    message body), with its content type and encoding."""
    content_type, encoding, data = dumps((tuple(args or ()), dict(kwargs or {})), serializer)
    raw = (
        data.encode(encoding if encoding != "binary" else "utf-8")
        if isinstance(data, str)
        else data
    )
    return bytes(msgpack.packb([content_type, encoding, raw], use_bin_type=True))


def unpack_arguments(
    body: bytes, accept: Iterable[str] | None = None
) -> tuple[list[object], dict[str, object]]:
    """The ``(args, kwargs)`` of :func:`pack_arguments`'s bytes; ``accept``: the content
    types the worker accepts (Celery's ``accept_content``; None: the body's own)."""
    content_type, encoding, data = msgpack.unpackb(body, raw=False)
    accept = {content_type} if accept is None else prepare_accept_content(accept)
    args, kwargs = loads(data, content_type, encoding, accept=accept)
    return list(args), dict(kwargs)


@dataclass(frozen=True, slots=True)
class Latest:
    """What a key's duplicates left for its holder's run (take_latest.lua's answer)."""

    #: When the burst's first call was made (the producers' clock).
    first_at: float
    #: When the run may start (debounce: the last call + debounce, capped by the max wait);
    #: 0 for a replace, whose run starts when its message comes.
    deadline: float
    #: :func:`pack_arguments`'s bytes: the last call's arguments.
    body: bytes
    #: The deadline had passed when asked (always True for a take).
    due: bool

    @classmethod
    def read(cls, reply: Sequence[object] | None) -> Latest | None:
        """take_latest.lua's reply: nil, or ``{due, entry}``."""
        if not reply:
            return None
        due, entry = reply
        first_at, deadline, body = msgpack.unpackb(entry, raw=True)
        return cls(float(first_at), float(deadline), bytes(body), bool(due))


@dataclass(frozen=True, slots=True)
class LatestWrite:
    """What a debounced or replacing call leaves for its holder's run if it is a duplicate
    (enqueue_latest.lua, publish_latest.lua)."""

    #: :func:`pack_arguments`'s bytes of this call's arguments.
    arguments: bytes
    #: When the call was made (the producer's clock).
    now: float
    #: The quiet period, seconds (None: a replace, no deadline), and its cap.
    debounce: float | None
    max_wait: float | None

    def argv(self) -> list[bytes | str]:
        """The scripts' arguments for it, in their order."""
        return [
            self.arguments,
            repr(self.now),
            repr(self.debounce or 0.0),
            repr(self.max_wait or 0.0),
        ]
