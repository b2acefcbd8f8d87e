"""The rows of the web view: one live key each, found by a scan that follows SCAN's cursor a
bounded stretch per request, and hands back the cursor to go on from. No index: a request
costs the keys it looks at (at most :data:`LOOK_AT_MOST`), never the whole keyspace, and
nothing is kept between requests (docs/web-view.md says why).

A row shows the key's digest, never the call's arguments: the record holds none.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from dedupe.errors import RecordFormatError
from dedupe.runs.inventory import glob_escaped, read_keys, task_of_key
from dedupe.store.clients import DedupRedis
from dedupe.values.keys import FLOW_SUFFIXES, parse_call_key, tag_safe
from dedupe.values.record import Holder

__all__ = [
    "LOOK_AT_MOST",
    "SORTS",
    "STATES",
    "Find",
    "KeyPage",
    "KeyRow",
    "key_page",
    "key_row",
    "key_rows",
]

#: The states a row may show, in the order the page lists them.
STATES = ("provisional", "queued", "running")
#: How a page may be ordered: in SCAN's order (pages by cursor: the cheapest), by age, or by
#: task name. A sorted page is exact over every key that matches (a walk to the cursor's end).
SORTS = ("", "oldest", "newest", "task")
#: The keys one request looks at, at most (SCAN's COUNT, summed), and the values it reads.
LOOK_AT_MOST = 20_000
READ_AT_MOST = 5_000
#: Seconds a request scans for, at most (a busy Redis makes it hand back its cursor sooner).
SCAN_FOR = 0.25
#: SCAN's COUNT, at most: keys looked at per SCAN command. A page in SCAN's order starts at
#: its size (a dense match fills it without overshooting by much) and doubles up to this.
SCAN_COUNT = 1_000


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
class Find:
    """What a page asks for: its filters, its order, and where a sorted page starts.

    >>> find = Find(search="port", state="queued")
    >>> row = KeyRow("reports", "k", "d", "queued", "5b1f", None, 1.0, None, 9.0, False)
    >>> find.matches(row), Find(search="5b1f").matches(row), Find(search="x").matches(row)
    (True, True, False)
    """

    #: Exactly this task's keys (a SCAN pattern narrows the scan to them).
    task: str | None = None
    #: Part of a task name, or the start of a holder task id.
    search: str | None = None
    state: str | None = None
    sort: str = ""
    #: A sorted page's rows come after this row's place (:meth:`place`): the last one shown.
    after: tuple[Any, ...] | None = None

    def matches(self, row: KeyRow) -> bool:
        """Does ``row`` pass the filters (its place aside)?"""
        if self.state is not None and row.state != self.state:
            return False
        if self.search is not None:
            text = self.search.casefold()
            return text in row.task.casefold() or row.holder.casefold().startswith(text)
        return True

    def place(self, row: KeyRow) -> tuple[Any, ...]:
        """``row``'s place in the page's order (keys with no age go last)."""
        since = math.inf if row.since is None else row.since
        if self.sort == "oldest":
            return (since, row.key)
        if self.sort == "newest":
            return (-since if row.since is not None else math.inf, row.key)
        return (row.task, row.key)

    def place_of(self, prefix: str, key: str, since: float | None) -> tuple[Any, ...]:
        """The place of a row shown before, from its key and since (what a page sends back)."""
        task = task_of_key(prefix, key) or ""
        return self.place(KeyRow(task, key, "", "", "", None, since, None, None, False))


@dataclass(frozen=True, slots=True)
class KeyPage:
    """The rows one request found, the cursor to go on from (0: the scan is done), and what
    it cost: keys looked at (SCAN's COUNT, summed) and values read."""

    rows: list[KeyRow]
    cursor: int
    looked_at: int
    read: int


def key_page(
    client: DedupRedis, prefix: str, find: Find, *, cursor: int = 0, size: int = 200
) -> KeyPage:
    """The rows that match ``find`` in the stretch of the keyspace one request scans from
    ``cursor``: until ``size`` rows matched (in SCAN's order) or the request's budget is
    spent. A sorted page gets the first ``size`` rows of its stretch in its order: the page
    walks every stretch and keeps the first ``size`` of them all."""
    pattern = f"{glob_escaped(prefix)}:" + (
        f"{{{glob_escaped(tag_safe(find.task))}:*" if find.task is not None else "*"
    )
    started = time.monotonic()
    rows: list[KeyRow] = []
    looked_at = read = 0
    count = SCAN_COUNT if find.sort else min(SCAN_COUNT, size)
    while True:
        cursor, found = client.scan(cursor=cursor, match=pattern, count=count)
        looked_at += count
        count = min(SCAN_COUNT, 2 * count)
        names = [name for name in map(_text, found) if _listed(prefix, find.task, name)]
        read += len(names)
        rows += _matching(client, prefix, find, names)
        if (
            not cursor
            or (not find.sort and len(rows) >= size)
            or looked_at >= LOOK_AT_MOST
            or read >= READ_AT_MOST
            or time.monotonic() - started >= SCAN_FOR
        ):
            break
    if find.sort:
        rows.sort(key=find.place)
        rows = rows[:size]
    return KeyPage(_with_ttls(client, rows), cursor, looked_at, read)


def key_row(client: DedupRedis, prefix: str, key: str) -> KeyRow | None:
    """The row of one key of ``prefix``, or None when it is free (or not a key of ours)."""
    rows = key_rows(client, prefix, [key])
    return rows[0] if rows else None


def key_rows(client: DedupRedis, prefix: str, keys: list[str]) -> list[KeyRow]:
    """The rows of the keys of ``prefix`` that are still live, in one round trip: what a
    page shown before reads to refresh itself."""
    names = [key.encode() for key in keys if task_of_key(prefix, key) is not None]
    found = (KeyRow.of(prefix, *each) for each in read_keys(client, names)) if names else ()
    return [row for row in found if row is not None]


def _text(key: bytes | str) -> str:
    return key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else key


def _listed(prefix: str, task: str | None, name: str) -> bool:
    # The pattern's "*" also matches the rest of a longer name ("reports:eu" for "reports"):
    # only a key that parses back to the very name is the task's. Flow control's keys beside
    # a record (a debounced call's latest arguments, a limited key's line) are no records.
    if name.endswith(FLOW_SUFFIXES):
        return False
    parts = parse_call_key(prefix, name)
    return parts is not None and (task is None or parts.task_name == task)


def _matching(client: DedupRedis, prefix: str, find: Find, names: list[str]) -> list[KeyRow]:
    """The rows of ``names`` that pass ``find`` (and come after its place): one round trip
    of GETs, the TTLs read later for the rows kept only."""
    if not names:
        return []
    with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.get(name)
        values = pipe.execute(raise_on_error=False)
    rows = []
    for name, raw in zip(names, values, strict=True):
        row = KeyRow.of(prefix, name, raw, -1) if isinstance(raw, bytes) else None
        if row is None or not find.matches(row):
            continue
        if find.sort and find.after is not None and find.place(row) <= find.after:
            continue
        rows.append(row)
    return rows


def _with_ttls(client: DedupRedis, rows: list[KeyRow]) -> list[KeyRow]:
    """``rows`` with the time each key has left (keys gone meanwhile left out)."""
    if not rows:
        return rows
    with client.pipeline(transaction=False) as pipe:
        for row in rows:
            pipe.pttl(row.key)
        pttls = pipe.execute(raise_on_error=False)
    return [
        dataclasses.replace(row, ttl=pttl / 1000 if pttl >= 0 else None)
        for row, pttl in zip(rows, pttls, strict=True)
        if isinstance(pttl, int) and pttl != -2
    ]
