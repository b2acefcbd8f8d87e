"""The rows of the web view: one live key each, read a page at a time (never the whole
keyspace in a request), as the JSON the page and scripts get.

A row shows the key's digest, never the call's arguments: the record holds none.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dedupe.errors import RecordFormatError
from dedupe.runs.inventory import read_keys, scan_page, task_of_key
from dedupe.store.clients import DedupRedis
from dedupe.values.keys import parse_call_key
from dedupe.values.record import Holder

__all__ = ["STATES", "KeyPage", "KeyRow", "key_page", "key_row"]

#: The states a row may show, in the order the page lists them.
STATES = ("provisional", "queued", "running")


@dataclass(frozen=True, slots=True)
class KeyRow:
    """One live key, as the page shows it."""

    task: str
    key: str
    #: The call's arguments digest (the key's last part).
    digest: str
    state: str
    #: The task id that holds the key.
    holder: str
    #: ``host:pid`` of the worker process running it (running keys only).
    worker: str | None
    #: When the call was accepted, or the run started (epoch seconds), if the record says.
    since: float | None
    #: When a countdown or eta call may run.
    eta: float | None
    #: Seconds until the key frees itself unless renewed; None: no expiry.
    ttl: float | None
    #: The separate run lock of a ``unique_until="started"`` call.
    run_lock: bool

    @classmethod
    def of(cls, prefix: str, key: str, raw: bytes, pttl: int) -> KeyRow | None:
        """The row of a key, or None for a value that is no record of ``prefix``'s.

        >>> from dedupe.values.record import pack_queued
        >>> key = "dedupe:{t:" + "0" * 32 + "}"
        >>> row = KeyRow.of("dedupe", key, pack_queued("a", 5.0, None), 900)
        >>> (row.task, row.state, row.holder, row.ttl)
        ('t', 'queued', 'a', 0.9)
        """
        parts = parse_call_key(prefix, key)
        if parts is None:
            return None
        try:
            holder = Holder.from_raw(key, raw, pttl if pttl >= 0 else None)
        except RecordFormatError:
            return None
        return cls(
            task=parts.task_name,
            key=key,
            digest=parts.digest,
            state="provisional" if holder.provisional else holder.state,
            holder=holder.task_id,
            worker=holder.worker,
            since=holder.started_at if holder.state == "running" else holder.enqueued_at,
            eta=holder.eta,
            ttl=holder.ttl,
            run_lock=parts.run_lock,
        )

    def as_json(self, now: float) -> dict[str, Any]:
        """The row as the API answers it, with its age and the end of its lease or TTL."""
        fields = asdict(self)
        fields["age"] = None if self.since is None else round(max(0.0, now - self.since), 1)
        fields["ends_at"] = None if self.ttl is None else round(now + self.ttl, 3)
        return fields


@dataclass(frozen=True, slots=True)
class KeyPage:
    """The rows of one request, and the cursor to go on from (0: the keyspace is done)."""

    rows: list[KeyRow]
    cursor: int


def key_page(
    client: DedupRedis,
    prefix: str,
    *,
    task: str | None = None,
    state: str | None = None,
    cursor: int = 0,
    size: int = 200,
) -> KeyPage:
    """One page of live keys (of one task, in one state), sorted by task and age."""
    cursor, found = scan_page(client, prefix, task, cursor, size)
    rows = [row for row in (KeyRow.of(prefix, *each) for each in found) if row is not None]
    if state is not None:
        rows = [row for row in rows if row.state == state]
    rows.sort(key=lambda row: (row.task, row.since or 0.0, row.key))
    return KeyPage(rows, cursor)


def key_row(client: DedupRedis, prefix: str, key: str) -> KeyRow | None:
    """The row of one key of ``prefix``, or None when it is free (or not a key of ours)."""
    if task_of_key(prefix, key) is None:
        return None
    for name, raw, pttl in read_keys(client, [key.encode()]):
        return KeyRow.of(prefix, name, raw, pttl)
    return None
