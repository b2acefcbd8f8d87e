"""The reaper: frees the ``queued`` records whose message is in none of the places it can be.

A message can end where no worker sees it (a purge, a queue deleted, a broker's drop by TTL,
length or dead-lettering): its record would answer every call of its key with a task that
never runs, until ``unique_ttl``. A pass reads the queued records older than the margin,
asks the broker which of their messages it may still hold (``Broker.search``) and the
workers which they hold, and frees a record the pass before found without a message too, if
it still holds the same bytes (reap.lua):

- a message moving between two places during one pass is found by the next;
- a record claimed by a run, or written anew by a later call, has changed, and stays.
One worker sweeps at a time, every ``dedupe_reap_interval`` s, a slice of the keys a pass
(``celery dedupe reap``: a round, then the suspects again). docs/design-notes.md,
"dedupe.runs.reaping".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

import redis.cluster

from dedupe.store.clients import DedupRedis
from dedupe.store.replies import decoded
from dedupe.store.store import Store
from dedupe.values.keys import holds_keys, parse_call_key, reaper_keys
from dedupe.values.record import Holder

from .inventory import glob_escaped
from .runtime import Runtime

__all__ = ["MAY_HOLD_UNREAD", "Pass", "Reaper", "Suspect"]

logger = logging.getLogger("dedupe.keys")

#: The longest share of its time a worker spends sweeping: the next pass waits this many
#: times the last pass's length, when that is longer than the interval.
_DUTY = 20


@dataclass(frozen=True, slots=True)
class Suspect:
    """A queued record a pass found without a message."""

    task_name: str
    task_id: str
    raw: bytes
    #: When a pass first found it without a message (seconds since the epoch).
    since: float


@dataclass(frozen=True, slots=True)
class Pass:
    """What one pass did, and what it cost."""

    #: Queued records older than the margin, in this pass's slice of the keys.
    candidates: int = 0
    #: Of those, the ones without a message (kept for the next pass, unless freed now).
    suspects: int = 0
    #: Call keys freed (found without a message by this pass and the one before).
    freed: list[str] = field(default_factory=list)
    #: Live keys read, and broker messages read, to know.
    keys_read: int = 0
    messages_read: int = 0
    seconds: float = 0.0
    #: The broker could not be asked (nothing freed).
    blind: bool = False


#: In a worker's report of what it holds: it may hold messages it has not read (a run blocks
#: the thread that reads its connection), which no queue counts: no pass frees a key then.
MAY_HOLD_UNREAD = "?unread"

#: Seconds at least between the pass that first found a record without a message and the
#: one that frees it (the interval, when shorter): a worker reports what it holds this often.
APART = 5.0

#: Live keys a pass reads at most: a pass over a large keyspace reads a slice of it, and
#: the next goes on from its SCAN cursor.
KEYS_PER_PASS = 10_000


class Reaper:
    """The passes of one process's reaper over ``runtime``'s keys; a pass frees only what
    an earlier pass of this same reaper found without a message."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._suspects: dict[str, Suspect] = {}
        #: Where the next pass's slice of the keyspace begins (0: a new round).
        self._cursor = 0
        self.last: Pass | None = None

    @property
    def store(self) -> Store:
        return self._runtime.store

    @property
    def round_done(self) -> bool:
        """Did the last pass reach the end of the keyspace (every key read since round 0)?"""
        return self._cursor == 0

    def next_pass_in(self, interval: float) -> float:
        """Seconds until the next pass: the interval, or more after a long pass."""
        last = self.last.seconds if self.last is not None else 0.0
        return max(interval, _DUTY * last)

    def sweep(self, now: float | None = None, *, keys: int = KEYS_PER_PASS) -> Pass:
        """One pass (see the module's docs) over the next ``keys`` live keys and what the
        passes before found without a message. Raises
        :class:`~dedupe.errors.RedisUnavailable` when the dedup Redis cannot be read, and
        the broker's errors when it cannot be read: nothing is freed then."""
        began = time.monotonic()
        config = self._runtime.config
        now = time.time() if now is None else now
        queued, keys_read = self._queued(config.key_prefix, now - config.reap_margin, keys)
        sliced = len(queued)
        queued.update(self._unchanged_suspects(queued))
        if not queued:
            self._keep({})
            return self._done(Pass(keys_read=keys_read), began)
        calls = {task_id: name for name, task_id, _ in queued.values()}
        search = self._runtime.broker.search(calls)
        if search is None:
            self._keep({})
            return self._done(Pass(sliced, keys_read=keys_read, blind=True), began)
        # (Where the broker shows every worker's unacked messages, the search found them.)
        held = (
            set()
            if self._runtime.broker.lists_unacked
            else self.store.held(holds_keys(config.key_prefix, "")[0])
        )
        if MAY_HOLD_UNREAD in held:
            self._keep({})
            return self._done(Pass(sliced, keys_read=keys_read, blind=True), began)
        unseen = {
            key: call
            for key, call in queued.items()
            if call[1] not in search.found and call[1] not in held
        }
        # (A key_concurrency call that waits in its line is held there, message and all.)
        waiting = self.store.in_lines([(key, task_id) for key, (_, task_id, _) in unseen.items()])
        missing = {
            key: Suspect(name, task_id, raw, self._since(key, raw, now))
            for key, (name, task_id, raw) in unseen.items()
            if task_id not in waiting
        }
        # (Passes of one round come back to back: a record is freed apart from its finding.)
        apart = min(config.reap_interval, APART) if config.reap_interval else APART
        ripe = [key for key, suspect in missing.items() if now - suspect.since >= apart]
        freed = [
            key
            for key, done in zip(
                ripe, self.store.reap([(key, missing[key].raw) for key in ripe]), strict=True
            )
            if done
        ]
        for key in freed:
            suspect = missing.pop(key)
            logger.warning(
                "%s[%s] has no message on the broker (purged, dropped or expired there): its "
                "key %s was freed",
                suspect.task_name,
                suspect.task_id,
                key,
            )
        self._keep(missing)
        done = Pass(sliced, len(missing), freed, keys_read, search.messages)
        return self._done(done, began)

    def _queued(
        self, prefix: str, before: float, most: int
    ) -> tuple[dict[str, tuple[str, str, bytes]], int]:
        """The queued records accepted before ``before`` (and due before it) among the next
        ``most`` keys: call key -> (task name, task id, record); and how many were read."""
        found: dict[str, tuple[str, str, bytes]] = {}
        if most <= 0:
            return found, 0
        client = self.store.client
        pattern = f"{glob_escaped(prefix)}:*"
        if isinstance(client, redis.cluster.RedisCluster):
            # (A cursor per node: a Cluster's keys are read whole at each pass.)
            batches: Iterable[Iterable[bytes | str]] = [client.scan_iter(match=pattern)]
        else:
            batches = self._slice(client, pattern, most)
        calls = {
            name: parts
            for batch in batches
            for name in map(decoded, batch)
            if (parts := parse_call_key(prefix, name)) is not None and not parts.run_lock
        }
        names = list(calls)
        for key, raw in zip(names, _values(client, names), strict=True):
            if raw is None:
                continue
            parts = calls[key]
            holder = _queued_holder(key, raw)
            if holder is None or holder.enqueued_at is None:
                continue
            if holder.enqueued_at < before and (holder.eta is None or holder.eta < before):
                found[key] = (parts.task_name, holder.task_id, raw)
        return found, len(names)

    def _slice(self, client: DedupRedis, pattern: str, most: int) -> Iterator[list[bytes | str]]:
        """SCAN batches from where the last pass stopped, about ``most`` keys in all."""
        looked = 0
        while looked < most:
            count = min(1000, most)
            self._cursor, batch = client.scan(cursor=self._cursor, match=pattern, count=count)
            looked += len(batch)
            yield batch
            if self._cursor == 0:
                return

    def _unchanged_suspects(
        self, queued: Mapping[str, tuple[str, str, bytes]]
    ) -> dict[str, tuple[str, str, bytes]]:
        """The suspects of the passes before, outside this pass's slice, that still hold the
        same record (one read each)."""
        others = [key for key in self._suspects if key not in queued]
        values = _values(self.store.client, others)
        return {
            key: (self._suspects[key].task_name, self._suspects[key].task_id, raw)
            for key, raw in zip(others, values, strict=True)
            if raw is not None and raw == self._suspects[key].raw
        }

    def _since(self, key: str, raw: bytes, now: float) -> float:
        """When this record was first found without a message: by a pass before, or now."""
        known = self._suspects.get(key)
        return known.since if known is not None and known.raw == raw else now

    def _keep(self, suspects: Mapping[str, Suspect]) -> None:
        self._suspects = dict(suspects)
        config = self._runtime.config
        # Shown until two intervals pass without a pass that found them.
        ttl = max(2 * config.reap_interval, 10.0)
        self.store.mark_suspects(
            reaper_keys(config.key_prefix)[1],
            {key: suspect.since for key, suspect in suspects.items()},
            int(ttl * 1000),
        )

    def _done(self, done: Pass, began: float) -> Pass:
        done = replace(done, seconds=time.monotonic() - began)
        self.last = done
        return done


def _values(client: DedupRedis, names: list[str]) -> list[bytes | None]:
    """Each key's value, in one round trip (GETs in a pipeline: keys of different tasks
    may sit in different Cluster slots); None for one gone or of another type."""
    if not names:
        return []
    with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.get(name)
        replies = pipe.execute(raise_on_error=False)
    return [reply if isinstance(reply, bytes) else None for reply in replies]


def _queued_holder(key: str, raw: bytes) -> Holder | None:
    """The holder of a plain queued record (not provisional), else None."""
    try:
        holder = Holder.from_raw(key, raw, None)
    except ValueError:
        return None
    return holder if holder.state == "queued" and not holder.provisional else None
