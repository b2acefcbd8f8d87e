"""The record stored under a key, and what callers see of it (:class:`Holder`).

One msgpack array per key, decoded by the Lua scripts with ``cmsgpack``. Hence: no bin or
ext types (``use_bin_type=False``), no None values, ids as strings (Lua numbers are doubles).
The state is told by the shape, so no field names and no state field are stored:

=======  ==================================================================================
queued   ``[owner, enqueued_at]``, or ``[owner, enqueued_at, eta]`` for a countdown/eta call
running  ``[owner, run token, worker host, worker pid, started_at]``
=======  ==================================================================================

Every byte of value counts: Redis rounds a string's allocation up in 16-byte steps, and a key
with a TTL already costs ~130 bytes of its own (a 66-character key). So the owner is the task
id packed to 17 bytes when it is a UUID in its usual text form (36 characters as text);
``eta`` and ``started_at`` are whole seconds (4-byte integers, where a double takes 8). The
enqueue time stays a double: it is what makes the bytes of each call unique (enqueue.lua tells
a re-sent command by its bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgpack

from .errors import RecordFormatError

__all__ = ["Holder", "owner_of", "pack_queued", "pack_running", "task_id_of"]

# One packer for every record (packb would make a new one per call); msgpack packs under
# the GIL, so threads can share it.
_pack = msgpack.Packer(use_bin_type=False, autoreset=True).pack

# Leads a packed UUID. The byte 0xFF never occurs in UTF-8, so no other task id's bytes can
# start with it: the two forms never meet, and no escaping is needed.
_UUID = b"\xff"
_UUID_LENGTH = 1 + 16
_RUNNING_LENGTH = 5
_QUEUED_LENGTHS = (2, 3)
_NUMBERS = (int, float)


def owner_of(task_id: str) -> bytes:
    """The task id as records store it and the scripts compare it.

    >>> owner_of("0b9e4f34-2a8c-4c5e-9d7e-1f2a3b4c5d6e").hex()
    'ff0b9e4f342a8c4c5e9d7e1f2a3b4c5d6e'
    >>> owner_of("report-2026-11-23")
    b'report-2026-11-23'
    """
    if len(task_id) == 36 and task_id[8] == task_id[13] == task_id[18] == task_id[23] == "-":
        digits = task_id.replace("-", "")
        try:
            packed = bytes.fromhex(digits)
        except ValueError:
            packed = b""
        # Only the lowercase text form with exactly those four dashes packs: it is the form
        # task_id_of gives back (fromhex would also take upper case and spaces, and more
        # dashes would pack shorter).
        if len(packed) == 16 and packed.hex() == digits:
            return _UUID + packed
    # surrogatepass: a str Celery carried may hold lone surrogates; they still round-trip.
    return task_id.encode("utf-8", "surrogatepass")


def task_id_of(owner: bytes) -> str:
    """The task id back from :func:`owner_of`."""
    if owner[:1] == _UUID and len(owner) == _UUID_LENGTH:
        digits = owner[1:].hex()
        return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"
    return owner.decode("utf-8", "surrogatepass")


def pack_queued(task_id: str, enqueued_at: float, eta: float | None) -> bytes:
    """The record of a call that was accepted and published."""
    if eta is None:
        return bytes(_pack((owner_of(task_id), enqueued_at)))
    return bytes(_pack((owner_of(task_id), enqueued_at, int(eta))))


def pack_running(task_id: str, token: str, host: str, pid: int, started_at: float) -> bytes:
    """The record of a run, as the heartbeat re-creates it when the key was lost (claim.lua
    builds the same array)."""
    return bytes(_pack((owner_of(task_id), token, host, pid, int(started_at))))


@dataclass(frozen=True, slots=True)
class Holder:
    """The task that holds a key: what :func:`dedupe.lookup` and duplicates report."""

    key: str
    #: The id of the task that holds the key; a duplicate call's result points at it.
    task_id: str
    state: Literal["queued", "running"]
    #: Seconds until the key frees itself if nobody renews or clears it; None if unknown.
    ttl: float | None
    #: When the call was accepted (queued records only).
    enqueued_at: float | None = None
    #: When a countdown/eta call may run, whole seconds (queued records only).
    eta: float | None = None
    #: When the run started, whole seconds (running records only).
    started_at: float | None = None
    #: ``host:pid`` of the worker process running it.
    worker: str | None = None

    @classmethod
    def from_raw(cls, key: str, raw: bytes, pttl_ms: int | None) -> Holder:
        """Read a record (raises :class:`RecordFormatError` for any value that is none)."""
        ttl = pttl_ms / 1000 if pttl_ms is not None and pttl_ms >= 0 else None
        try:
            # raw=True: the owner may be a packed UUID, which is no UTF-8.
            fields = msgpack.unpackb(raw, raw=True, use_list=False)
            # A value of another program can parse as well: every field's type is checked,
            # so what callers get (and the CLI prints) is a real record.
            if type(fields) is tuple and len(fields) == _RUNNING_LENGTH:
                owner, token, host, pid, started_at = fields
                if (
                    type(owner) is bytes
                    and type(token) is bytes
                    and type(host) is bytes
                    and type(pid) is int
                    and type(started_at) in _NUMBERS
                ):
                    worker = f"{host.decode('utf-8', 'surrogateescape')}:{pid}"
                    task_id = task_id_of(owner)
                    return cls(key, task_id, "running", ttl, None, None, started_at, worker)
            elif type(fields) is tuple and len(fields) in _QUEUED_LENGTHS:
                owner, enqueued_at, *rest = fields
                eta = rest[0] if rest else None
                if (
                    type(owner) is bytes
                    and type(enqueued_at) in _NUMBERS
                    and (eta is None or type(eta) in _NUMBERS)
                ):
                    return cls(key, task_id_of(owner), "queued", ttl, enqueued_at, eta)
        # msgpack's own errors, and an owner that is no UTF-8, are ValueErrors.
        except ValueError:
            pass
        raise RecordFormatError(key)
