"""The record stored under a key, and what callers see of it (:class:`Holder`).

One msgpack map per key, decoded by the Lua scripts with ``cmsgpack``. Hence: no bin or ext
types (``use_bin_type=False``), no None values (cmsgpack drops them), ids as strings (Lua
numbers are doubles). One-letter field names and whole-second times (4-byte integers, where a
double takes 8) keep a live key small; the enqueue time stays a double, because it is what
makes the bytes of each call unique (enqueue.lua tells a re-sent command by its bytes):

====  =======================================================
i     task id of the owner (the owner token)
s     ``q`` queued, ``r`` running
q     enqueue time, unix seconds
e     eta, whole unix seconds (countdown/eta calls only; dropped when the run starts)
r     run token: which run of the owner holds the lease
h, p  worker host and pid of that run
b     run start time, whole unix seconds
====  =======================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgpack

__all__ = ["Holder", "pack_queued", "pack_running"]

# One packer for every record (packb would make a new one per call); msgpack packs under
# the GIL, so threads can share it.
_pack = msgpack.Packer(use_bin_type=False, autoreset=True).pack


def pack_queued(task_id: str, enqueued_at: float, eta: float | None) -> bytes:
    """The record of a call that was accepted and published."""
    if eta is None:
        return bytes(_pack({"i": task_id, "s": "q", "q": enqueued_at}))
    return bytes(_pack({"i": task_id, "s": "q", "q": enqueued_at, "e": int(eta)}))


def pack_running(task_id: str, token: str, host: str, pid: int, started_at: float) -> bytes:
    """The record of a run, as the heartbeat re-creates it when the key was lost."""
    return bytes(
        _pack({"i": task_id, "s": "r", "r": token, "h": host, "p": pid, "b": int(started_at)})
    )


@dataclass(frozen=True, slots=True)
class Holder:
    """The task that holds a key: what :func:`dedupe.lookup` and duplicates report."""

    key: str
    #: The id of the task that holds the key; a duplicate call's result points at it.
    task_id: str
    state: Literal["queued", "running"]
    #: Seconds until the key frees itself if nobody renews or clears it; None if unknown.
    ttl: float | None
    enqueued_at: float | None = None
    eta: float | None = None
    started_at: float | None = None
    #: ``host:pid`` of the worker process running it.
    worker: str | None = None

    @classmethod
    def from_raw(cls, key: str, raw: bytes, pttl_ms: int | None) -> Holder:
        fields = _unpack(raw)
        get = fields.get
        host = get("h")
        pid = get("p")
        return cls(
            key,
            str(fields["i"]),
            "running" if get("s") == "r" else "queued",
            pttl_ms / 1000 if pttl_ms is not None and pttl_ms >= 0 else None,
            get("q"),
            get("e"),
            get("b"),
            f"{host}:{int(pid)}" if host is not None and pid is not None else None,
        )


def _unpack(raw: bytes) -> dict[str, Any]:
    fields: dict[str, Any] = msgpack.unpackb(raw, raw=False)
    return fields
