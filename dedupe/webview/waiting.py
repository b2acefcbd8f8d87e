"""The calls that wait for their turn under per-key flow control, for the web view: those in a
``key_concurrency`` line (handed a slot or not) and the planned starts of ``key_rate_limit``
keys (:meth:`~dedupe.store.commands.lines.LineCommands.waiting_under`, as ``celery dedupe
list`` reads them).

That read is a SCAN of the whole keyspace (the lines and plans have no index it could read
instead): at a million keys it keeps Redis busy about two seconds. So a reading is kept and
served again until it is ten times as old as it took (as the totals' count), and a page
left open never keeps Redis scanning more than a tenth of the time. Read only when a
request asks: a server no browser looks at reads nothing.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from dedupe.runs.inventory import glob_escaped, task_keys_pattern
from dedupe.store.commands.lines import WaitingCall
from dedupe.store.store import Store
from dedupe.values.keys import parse_call_key

from .totals import read_again_after

__all__ = ["MOST_WAITING", "Reading", "Waiting", "WaitingRow"]

#: The most waiting calls one answer lists.
MOST_WAITING = 200
#: The fewest seconds between two readings of one filter (many tabs read once).
FRESH_FOR = 0.5
#: Filters whose last reading is kept (the oldest goes first).
KEPT = 32
#: What an answer says on a Redis Cluster, whose lines are spread over its masters.
CLUSTER_NOTE = "not listed on a Redis Cluster: the waiting calls are read on one server only"


class WaitingRow(TypedDict):
    """One waiting call as the API answers it."""

    #: Which limit it waits under.
    limit: Literal["key_concurrency", "key_rate_limit"]
    task: str
    #: Its key (``<prefix>:{<task>:<digest>}``), and the digest of its arguments.
    key: str
    digest: str
    task_id: str
    #: Its place in its key's line or plan: 1 goes next.
    position: int
    #: A slot was handed to it, its run not started yet (``key_concurrency``).
    handed: bool
    #: When its planned start is due (``key_rate_limit``; epoch seconds).
    due_at: float | None


@dataclass(frozen=True, slots=True)
class Reading:
    """One reading of the waiting calls (of one task, or of all): at most
    :data:`MOST_WAITING` of them, whether the read stopped there, when it was made and how
    long it took."""

    calls: list[WaitingRow] = field(default_factory=list)
    more: bool = False
    at: float = 0.0
    took: float = 0.0
    note: str | None = None

    def as_json(self) -> dict[str, object]:
        """The reading as ``/api/waiting`` answers it."""
        return {
            "calls": self.calls,
            "more": self.more,
            "most": MOST_WAITING,
            "read_at": self.at,
            "took": round(self.took, 3),
            "note": self.note,
        }


class Waiting:
    """The last reading of each task filter, read again once :meth:`stale`.

    .. code-block:: python

        waiting = Waiting(runtime.store, "dedupe")
        waiting.read("reports.refresh").calls  # [{'task_id': ..., 'position': 1, ...}]
    """

    def __init__(self, store: Store, prefix: str) -> None:
        self.store = store
        self.prefix = prefix
        self._last: dict[str | None, Reading] = {}
        # (One reading at a time: two tabs asking at once make one read, not two.)
        self._lock = threading.Lock()

    def read(self, task: str | None) -> Reading:
        """The waiting calls of ``task`` (None: of every task), read again if the last
        reading is stale."""
        with self._lock:
            last = self._last.get(task)
            if last is not None and not self.stale(last):
                return last
            reading = self._read(task)
            self._last.pop(task, None)
            if len(self._last) >= KEPT:
                del self._last[next(iter(self._last))]
            self._last[task] = reading
            return reading

    @staticmethod
    def stale(reading: Reading) -> bool:
        """Is ``reading`` older than ten times it took (:data:`FRESH_FOR` at least)?"""
        return time.time() - reading.at >= read_again_after(reading.took, FRESH_FOR)

    def _read(self, task: str | None) -> Reading:
        if self.store.server is None:
            return Reading(at=time.time(), note=CLUSTER_NOTE)
        started = time.monotonic()
        pattern = task_keys_pattern(task)
        # One more than shown: whether more wait.
        found = self.store.waiting_under(glob_escaped(self.prefix), pattern, MOST_WAITING + 1)
        calls = [row for call in found if (row := self._row(call, task)) is not None]
        calls.sort(key=lambda row: (row["limit"], row["task"], row["key"], row["position"]))
        # (The pattern's "*" also matches a longer task name's keys, left out above: a read
        # that stopped at its bound says more may wait, though they may be those.)
        more = len(found) > MOST_WAITING
        took = time.monotonic() - started
        return Reading(calls[:MOST_WAITING], more, time.time(), took)

    def _row(self, call: WaitingCall, task: str | None) -> WaitingRow | None:
        parts = parse_call_key(self.prefix, call.key)
        if parts is None or (task is not None and parts.task_name != task):
            return None
        return {
            "limit": "key_concurrency" if call.due_at is None else "key_rate_limit",
            "task": parts.task_name,
            "key": call.key,
            "digest": parts.digest,
            "task_id": call.task_id,
            "position": call.position,
            "handed": call.handed,
            "due_at": call.due_at,
        }
