"""Calls enqueued in batches: one call's keys and arguments, and a chunk's for
enqueue_many.lua (enqueue_latest_many.lua), and the per-call replies of a chunk."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dedupe.errors import UnexpectedReply
from dedupe.store.resp import Part, ScriptCall
from dedupe.values.keys import CallKeys
from dedupe.values.latest import LatestWrite

__all__ = [
    "ENQUEUE_CHUNK",
    "EnqueueCall",
    "LatestCall",
    "chunk_replies",
    "enqueue_call",
    "enqueue_latest_call",
    "enqueue_latest_many_call",
    "enqueue_many_call",
]

#: Calls one ``enqueue_many.lua`` decides at the most: a batch of thousands becomes scripts of
#: this many, pipelined, so that no script holds the server for long.
ENQUEUE_CHUNK = 256

#: One call of :meth:`~dedupe.store.store.Store.enqueue_many`: its keys, provisional record
#: and its ttl, ms.
EnqueueCall = tuple[CallKeys, bytes, int]
#: One call of :meth:`~dedupe.store.store.Store.enqueue_latest_many`: as :data:`EnqueueCall`,
#: and what it leaves as a duplicate.
LatestCall = tuple[CallKeys, bytes, int, LatestWrite]


def enqueue_call(call: EnqueueCall) -> ScriptCall:
    """The keys and arguments of enqueue.lua for one call."""
    keys, record, ttl_ms = call
    return [keys.call], [record, ttl_ms]


def enqueue_latest_call(call: LatestCall) -> ScriptCall:
    """The keys and arguments of enqueue_latest.lua for one call."""
    keys, record, ttl_ms, latest = call
    return [keys.call, keys.latest], [record, ttl_ms, *latest.argv()]


def enqueue_many_call(chunk: Sequence[EnqueueCall], marker: str | None) -> ScriptCall:
    """The keys and arguments of enqueue_many.lua for a chunk of calls (and the marker key,
    flagged by one more argument)."""
    keys: list[Part] = [keys.call for keys, _, _ in chunk]
    args: list[Part] = [part for _, record, ttl_ms in chunk for part in (record, ttl_ms)]
    return _marked(keys, args, marker)


def enqueue_latest_many_call(chunk: Sequence[LatestCall], marker: str | None) -> ScriptCall:
    """The keys and arguments of enqueue_latest_many.lua for a chunk of calls (and the
    marker key, flagged by one more argument)."""
    keys: list[Part] = []
    args: list[Part] = []
    for call in chunk:
        call_keys, call_args = enqueue_latest_call(call)
        keys.extend(call_keys)
        args.extend(call_args)
    return _marked(keys, args, marker)


def _marked(keys: list[Part], args: list[Part], marker: str | None) -> ScriptCall:
    if marker is not None:
        keys.append(marker)
        args.append(1)
    return keys, args


def chunk_replies(reply: Any, size: int) -> list[object]:
    """The per-call replies of one enqueue_many.lua (an error reply stands for each call)."""
    if isinstance(reply, BaseException):
        return [reply] * size
    if not isinstance(reply, list) or len(reply) != size:
        raise UnexpectedReply("enqueue_many", reply)
    return reply
