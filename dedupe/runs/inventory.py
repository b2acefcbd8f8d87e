"""The keys live under an app's prefix, read with SCAN (never KEYS) and batched GETs: what
``celery dedupe stats`` prints and the Prometheus live-keys gauge exports."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

from celery import Celery

from dedupe.store.clients import DedupRedis
from dedupe.values.keys import FLOW_SUFFIXES, parse_call_key, tag_safe
from dedupe.values.record import Holder

from .runtime import runtime_of

__all__ = [
    "glob_escaped",
    "live_key_counts",
    "live_keys",
    "read_keys",
    "scan",
    "scan_page",
    "task_keys_pattern",
    "task_of_key",
]

_BATCH = 500


def task_of_key(prefix: str, key: str) -> str | None:
    """The task name in a key of ``prefix`` (keys.parse_call_key reads them), or None.

    >>> task_of_key("dedupe", "dedupe:{reports:eu:0123456789abcdef0123456789abcdef}:run")
    'reports:eu'
    """
    parts = parse_call_key(prefix, key)
    return None if parts is None else parts.task_name


def glob_escaped(text: str) -> str:
    """``text`` matched literally in a SCAN pattern.

    >>> glob_escaped("jobs[1]*")
    'jobs\\\\[1\\\\]\\\\*'
    """
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def task_keys_pattern(task: str | None) -> str:
    """What follows ``<prefix>:`` in a SCAN pattern for the keys of ``task`` (every task's:
    None). A longer task name that begins with ``task:`` matches too: a reader filters.

    >>> task_keys_pattern("jobs[1]")
    '{jobs\\\\[1\\\\]:*'
    """
    return f"{{{glob_escaped(tag_safe(task))}:*" if task is not None else "*"


def scan(
    client: DedupRedis, prefix: str, task: str | None = None
) -> Iterator[tuple[str, bytes, int]]:
    """Every live key of ``prefix`` (of exactly the task named ``task``, when given): its
    name, value and pttl. Keys that vanish between the SCAN and the GET are passed over."""
    batch: list[bytes] = []
    for key in client.scan_iter(match=_pattern(prefix, task), count=1000):
        if not _is_of(prefix, task, key):
            continue
        batch.append(key)
        if len(batch) == _BATCH:
            yield from read_keys(client, batch)
            batch = []
    if batch:
        yield from read_keys(client, batch)


def scan_page(
    client: DedupRedis, prefix: str, task: str | None, cursor: int, size: int
) -> tuple[int, list[tuple[str, bytes, int]]]:
    """One page of :func:`scan`: SCAN from ``cursor`` until about ``size`` keys matched or
    ``10 * size`` were looked at (a rare task's keys may be few and far between), then their
    values in one round trip. Returns the cursor to go on from (0: the keyspace is done).

    A page costs the same at any size of the keyspace: what a web page may do per request.
    Not for a Redis Cluster, whose cursor is one per node.
    """
    pattern = _pattern(prefix, task)
    keys: list[bytes] = []
    looked_at = 0
    while True:
        cursor, found = client.scan(cursor=cursor, match=pattern, count=size)
        looked_at += size
        keys.extend(key for key in found if isinstance(key, bytes) and _is_of(prefix, task, key))
        if not cursor or len(keys) >= size or looked_at >= 10 * size:
            break
    return cursor, list(read_keys(client, keys)) if keys else []


def _pattern(prefix: str, task: str | None) -> str:
    head = f"{glob_escaped(prefix)}:"
    return f"{head}{{{glob_escaped(tag_safe(task))}:*" if task is not None else f"{head}*"


def _is_of(prefix: str, task: str | None, key: bytes) -> bool:
    # The pattern's "*" also matches the rest of a longer name ("reports:eu" for "reports"):
    # only a key that parses back to the very name is the task's. The keys of flow control
    # beside a record (a debounced call's latest arguments and ended runs, a limited key's
    # line and slots) are no records: never listed (another program's keys are, as unknown).
    name = key.decode()
    if task is None:
        return not name.endswith(FLOW_SUFFIXES)
    return task_of_key(prefix, name) == task


def read_keys(client: DedupRedis, keys: list[bytes]) -> Iterator[tuple[str, bytes, int]]:
    """The value and pttl of each key in one round trip (keys that are gone, or hold no
    string, are passed over)."""
    # Keys of different tasks may sit in different cluster slots: GETs one by one in a
    # pipeline, never an MGET across them.
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.get(key)
            pipe.pttl(key)
        replies = pipe.execute(raise_on_error=False)
    for index, key in enumerate(keys):
        raw, pttl = replies[2 * index], replies[2 * index + 1]
        if isinstance(raw, bytes) and isinstance(pttl, int):
            yield key.decode(), raw, pttl


def live_keys(app: Celery, task: str | None = None) -> Iterator[tuple[str, Holder]]:
    """Every live key of ``app``'s prefix (of one task): its task name and holder (values
    that are no record of ours are passed over)."""
    runtime = runtime_of(app)
    prefix = runtime.config.key_prefix
    for key, raw, pttl in scan(runtime.store.client, prefix, task):
        name = task_of_key(prefix, key)
        if name is None:
            continue
        try:
            holder = Holder.from_raw(key, raw, pttl if pttl > 0 else None)
        except ValueError:
            continue
        yield name, holder


def live_key_counts(app: Celery, task: str | None = None) -> Counter[tuple[str, str]]:
    """How many keys are live, by (task name, state); a provisional record counts as
    "provisional"."""
    return Counter(
        (name, "provisional" if holder.provisional else holder.state)
        for name, holder in live_keys(app, task)
    )
