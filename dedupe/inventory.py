"""The keys live under an app's prefix, read with SCAN (never KEYS) and batched GETs: what
``celery dedupe stats`` prints and the Prometheus live-keys gauge exports."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from celery import Celery
from redis import Redis

from .keys import RUN_SUFFIX
from .record import Holder
from .runtime import runtime_of

__all__ = ["live_key_counts", "live_keys", "task_of_key"]

_BATCH = 500


def task_of_key(prefix: str, key: str) -> str | None:
    """The task name in a key of ``prefix`` (keys.call_keys names them), or None.

    >>> task_of_key("dedupe", "dedupe:{reports:eu:0123456789abcdef0123456789abcdef}:run")
    'reports:eu'
    """
    head = f"{prefix}:{{"
    if not key.startswith(head):
        return None
    body = key[len(head) :]
    body = body.removesuffix(RUN_SUFFIX)
    if not body.endswith("}"):
        return None
    name, colon, digest = body[:-1].rpartition(":")
    if not colon or len(digest) != 32:
        return None
    return name


def live_keys(app: Celery) -> Iterator[tuple[str, Holder]]:
    """Every live key of ``app``'s prefix: its task name and holder (keys that vanish
    between the SCAN and the GET, or hold no record of ours, are passed over)."""
    runtime = runtime_of(app)
    prefix = runtime.config.key_prefix
    client = runtime.store.client
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) == _BATCH:
            yield from _read(client, prefix, batch)
            batch = []
    if batch:
        yield from _read(client, prefix, batch)


def _read(client: Redis, prefix: str, keys: list[bytes]) -> Iterator[tuple[str, Holder]]:
    # Keys of different tasks may sit in different cluster slots: GETs one by one in a
    # pipeline, never an MGET across them.
    with client.pipeline(transaction=False) as pipe:
        for raw_key in keys:
            pipe.get(raw_key)
            pipe.pttl(raw_key)
        replies = pipe.execute()
    for index, name in enumerate(keys):
        key = name.decode()
        raw, pttl = replies[2 * index], replies[2 * index + 1]
        task = task_of_key(prefix, key)
        if raw is None or task is None:
            continue
        try:
            holder = Holder.from_raw(key, raw, pttl if pttl > 0 else None)
        except ValueError:
            continue
        yield task, holder


def live_key_counts(app: Celery) -> Counter[tuple[str, str]]:
    """How many keys are live, by (task name, state)."""
    return Counter((task, holder.state) for task, holder in live_keys(app))
