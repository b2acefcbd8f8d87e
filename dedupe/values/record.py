"""The record stored under a key, and what callers see of it (:class:`Holder`).

One msgpack array per key, decoded by the Lua scripts with ``cmsgpack``. Hence: no bin or
ext types (``use_bin_type=False``), no None values, ids as strings (Lua numbers are doubles).
The state is told by the shape, so no field names and no state field are stored (the shapes
are in the design notes: docs/design-notes.md, "dedupe.values.record").
"""

from __future__ import annotations

import functools
import os
import random
import socket
from dataclasses import dataclass, field
from typing import Literal

import msgpack

from dedupe.errors import RecordFormatError

from .packing import shared_pack

__all__ = [
    "HOST",
    "RESTORED_MODES",
    "RESTORED_TOKEN",
    "Holder",
    "new_nonce",
    "pack_owner",
    "pack_provisional",
    "pack_queued",
    "pack_restored",
    "pack_running",
    "unpack_owner",
]

#: This machine's host name, as running records name it (``host:pid``).
HOST = socket.gethostname()

_pack = shared_pack(use_bin_type=False)

# Leads a packed UUID. The byte 0xFF never occurs in UTF-8, so no other task id's bytes can
# start with it: the two forms never meet, and no escaping is needed.
_UUID = b"\xff"
_UUID_LENGTH = 1 + 16
_RUNNING_LENGTH = 5
_RUNNING_WITH_LEASE_LENGTH = 6
_RUNNING_WITH_NEXT_LENGTH = 7
#: lease_ends and next, for a running record that ends before them.
_RUNNING_DEFAULTS = (0, b"")
_PROVISIONAL_LENGTH = 2
_NUMBERS = (int, float)


# A call packs its owner for the record and for the confirm, a run for the claim, its
# record and the release: the last few ids are remembered (bytes are immutable).
@functools.lru_cache(maxsize=64)
def pack_owner(task_id: str) -> bytes:
    """The task id as records store it and the scripts compare it.

    >>> pack_owner("0b9e4f34-2a8c-4c5e-9d7e-1f2a3b4c5d6e").hex()
    'ff0b9e4f342a8c4c5e9d7e1f2a3b4c5d6e'
    >>> pack_owner("report-2026-11-23")
    b'report-2026-11-23'
    """
    if len(task_id) == 36 and task_id[8] == task_id[13] == task_id[18] == task_id[23] == "-":
        digits = task_id.replace("-", "")
        try:
            packed = bytes.fromhex(digits)
        except ValueError:
            packed = b""
        # Only the lowercase text form with exactly those four dashes packs: it is the form
        # unpack_owner gives back (fromhex would also take upper case and spaces, and more
        # dashes would pack shorter).
        if len(packed) == 16 and packed.hex() == digits:
            return _UUID + packed
    # surrogatepass: a str Celery carried may hold lone surrogates; they still round-trip.
    return task_id.encode("utf-8", "surrogatepass")


def unpack_owner(owner: bytes) -> str:
    """The task id back from :func:`pack_owner`."""
    if owner[:1] == _UUID and len(owner) == _UUID_LENGTH:
        digits = owner[1:].hex()
        return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"
    return owner.decode("utf-8", "surrogatepass")


# A generator of our own: drawing from the random module's would move the application's
# seeded sequence with every call. Reseeded in a forked child, as the random module's is, so
# that producers forked from one parent never draw the same nonces.
_nonces = random.Random()
os.register_at_fork(after_in_child=_nonces.seed)


def new_nonce() -> int:
    """A call's nonce: 32 random bits (not secret: they only tell two calls apart)."""
    return _nonces.getrandbits(32)


def pack_provisional(task_id: str, nonce: int, *, owner: bytes | None = None) -> bytes:
    """The record of a call that was accepted and whose message is being published
    (``owner``: ``pack_owner(task_id)``, when the caller has it already)."""
    return bytes(_pack((owner or pack_owner(task_id), nonce)))


def pack_queued(
    task_id: str,
    enqueued_at: float,
    eta: float | None,
    nonce: int | None = None,
    *,
    owner: bytes | None = None,
) -> bytes:
    """The record of a call whose message is published (a new nonce unless one is given)."""
    if nonce is None:
        nonce = new_nonce()
    owner = owner or pack_owner(task_id)
    if eta is None:
        return bytes(_pack((owner, nonce, enqueued_at)))
    return bytes(_pack((owner, nonce, enqueued_at, float(eta))))


#: The run token (and host) of a restored record (see dedupe/store/lua/restore.lua): not one run's,
#: it stands for every run of its task id.
RESTORED_TOKEN = "restored"

#: The ``unique_until`` modes whose records are restored after a data loss: a message of
#: these holds its call's key until it runs (or, "finished", until its run ends); a throttle
#: window's key is its window, which no message can restore.
RESTORED_MODES = ("finished", "started")


def pack_restored(task_id: str, delivered_at: float) -> bytes:
    """The record of a message the broker holds for a worker, written back after Redis lost
    its key (restore.lua adds its lease). ``delivered_at`` stays exact: it tells this record
    from the restored records other transitions make (whole seconds), so that withdraw.lua
    touches only what the restore wrote."""
    fields = (pack_owner(task_id), RESTORED_TOKEN, RESTORED_TOKEN, 0, float(delivered_at))
    return bytes(_pack(fields))


def pack_running(task_id: str, token: str, host: str, pid: int, started_at: float) -> bytes:
    """The record of a run, as the heartbeat re-creates it when the key was lost (claim.lua
    builds the same array)."""
    return bytes(_pack((pack_owner(task_id), token, host, pid, int(started_at))))


@dataclass(frozen=True, slots=True)
class Holder:
    """The task that holds a key: what [`dedupe.lookup`][dedupe.lookup] and duplicates report."""

    key: str
    #: The id of the task that holds the key; a duplicate call's result points at it.
    task_id: str
    state: Literal["queued", "running"]
    #: Seconds until the key frees itself if nobody renews or clears it; None if unknown.
    ttl: float | None
    #: When the call was accepted (queued records only).
    enqueued_at: float | None = None
    #: When a countdown/eta call may run (queued records only).
    eta: float | None = None
    #: When the run started, whole seconds (running records only).
    started_at: float | None = None
    #: ``host:pid`` of the worker process running it.
    worker: str | None = None
    #: A queued record whose message is still being published (a short TTL until then).
    provisional: bool = False
    #: The run's token (running records only): it tells the run from a redelivered copy of
    #: its task id, which may take over the key of exactly this run once it is known dead.
    #: Not shown: a token means nothing to a reader.
    run_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_raw(cls, key: str, raw: bytes, pttl_ms: int | None) -> Holder:
        """Read a record (raises [`RecordFormatError`][dedupe.RecordFormatError] for any value
        that is none)."""
        ttl = pttl_ms / 1000 if pttl_ms is not None and pttl_ms >= 0 else None
        try:
            # raw=True: the owner may be a packed UUID, which is no UTF-8.
            fields = msgpack.unpackb(raw, raw=True, use_list=False)
            read = _READERS.get(len(fields)) if type(fields) is tuple else None
            holder = read(key, fields, ttl) if read is not None else None
        # msgpack's own errors, and an owner that is no UTF-8, are ValueErrors.
        except ValueError:
            holder = None
        if holder is None:
            raise RecordFormatError(key)
        return holder


# A value of another program can parse as well: every field's type is checked, so what
# callers get (and the CLI prints) is a real record.


def _running(key: str, fields: tuple[object, ...], ttl: float | None) -> Holder | None:
    owner, token, host, pid, started_at, *optional = fields
    # (older records end at started_at; lease_ends and next are each checked when present)
    padded: list[object] = [*optional, *_RUNNING_DEFAULTS[len(optional) :]]
    lease_ends, waiting = padded
    if (
        type(lease_ends) in _NUMBERS
        and type(waiting) is bytes
        and type(owner) is bytes
        and type(token) is bytes
        and type(host) is bytes
        and type(pid) is int
        and type(started_at) in _NUMBERS
    ):
        worker = f"{host.decode('utf-8', 'surrogateescape')}:{pid}"
        started = float(started_at)  # type: ignore[arg-type]
        run = token.decode("utf-8", "surrogateescape")
        return Holder(
            key, unpack_owner(owner), "running", ttl, None, None, started, worker, run_token=run
        )
    return None


def _provisional(key: str, fields: tuple[object, ...], ttl: float | None) -> Holder | None:
    owner, nonce = fields
    if type(owner) is bytes and type(nonce) is int:
        return Holder(key, unpack_owner(owner), "queued", ttl, provisional=True)
    return None


def _queued(key: str, fields: tuple[object, ...], ttl: float | None) -> Holder | None:
    owner, nonce, enqueued_at, *rest = fields
    eta = rest[0] if rest else None
    if (
        type(owner) is bytes
        and type(nonce) is int
        and type(enqueued_at) in _NUMBERS
        and (eta is None or type(eta) in _NUMBERS)
    ):
        return Holder(key, unpack_owner(owner), "queued", ttl, enqueued_at, eta)  # type: ignore[arg-type]
    return None


_READERS = {
    _RUNNING_LENGTH: _running,
    _RUNNING_WITH_LEASE_LENGTH: _running,
    _RUNNING_WITH_NEXT_LENGTH: _running,
    _PROVISIONAL_LENGTH: _provisional,
    3: _queued,
    4: _queued,
}
