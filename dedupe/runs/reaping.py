"""The reaper: frees the ``queued`` records whose message is in none of the places it can be.

A message can end where no worker sees it (a purge, a queue deleted, a broker's drop by TTL,
length or dead-lettering): its record would answer every call of its key with a task that
never runs, until ``unique_ttl``. A pass reads the queued records older than the margin,
asks the broker which of their messages it may still hold (``Broker.search``) and the
workers which they hold, and frees a record the pass before found without a message too, if
it still holds the same bytes (reap.lua):

- a message moving between two places during one pass is found by the next;
- a record claimed by a run, or written anew by a later call, has changed, and stays.

One worker sweeps at a time, every ``dedupe_reap_interval`` s (``celery dedupe reap``: two
passes at once). Design notes: docs/design-notes.md, "dedupe.runs.reaping".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from dedupe.store.store import Store
from dedupe.values.keys import holds_key, parse_call_key, reaper_keys
from dedupe.values.record import Holder

from .inventory import scan
from .runtime import Runtime

__all__ = ["Pass", "Reaper", "Suspect"]

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

    #: Queued records older than the margin.
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


class Reaper:
    """The passes of one process's reaper over ``runtime``'s keys; a pass frees only what
    the previous pass of this same reaper found without a message."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._suspects: dict[str, Suspect] = {}
        self.last: Pass | None = None

    @property
    def store(self) -> Store:
        return self._runtime.store

    def next_pass_in(self, interval: float) -> float:
        """Seconds until the next pass: the interval, or more after a long pass."""
        last = self.last.seconds if self.last is not None else 0.0
        return max(interval, _DUTY * last)

    def sweep(self, now: float | None = None) -> Pass:
        """One pass (see the module's docs). Raises :class:`~dedupe.errors.RedisUnavailable`
        when the dedup Redis cannot be read, and the broker's errors when it cannot be
        read: nothing is freed then, and the next pass starts afresh."""
        began = time.monotonic()
        config = self._runtime.config
        now = time.time() if now is None else now
        queued, keys_read = self._queued(config.key_prefix, now - config.reap_margin)
        if not queued:
            self._keep({})
            return self._done(Pass(keys_read=keys_read), began)
        calls = {raw_task_id: name for name, raw_task_id, _ in queued.values()}
        search = self._runtime.broker.search(calls)
        if search is None:
            self._keep({})
            return self._done(Pass(len(queued), keys_read=keys_read, blind=True), began)
        held = self.store.held(holds_key(config.key_prefix, "*"))
        missing = {
            key: Suspect(name, task_id, raw, self._since(key, raw, now))
            for key, (name, task_id, raw) in queued.items()
            if task_id not in search.found and task_id not in held
        }
        ripe = [key for key, suspect in missing.items() if suspect.since < now]
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
        done = Pass(len(queued), len(missing), freed, keys_read, search.messages)
        return self._done(done, began)

    def _queued(self, prefix: str, before: float) -> tuple[dict[str, tuple[str, str, bytes]], int]:
        """The queued records accepted before ``before`` (and due before it): call key ->
        (task name, task id, record); and how many keys were read."""
        found: dict[str, tuple[str, str, bytes]] = {}
        read = 0
        for key, raw, pttl in scan(self.store.client, prefix):
            read += 1
            parts = parse_call_key(prefix, key)
            if parts is None or parts.run_lock:
                continue
            try:
                holder = Holder.from_raw(key, raw, pttl if pttl > 0 else None)
            except ValueError:
                continue
            if holder.state != "queued" or holder.provisional or holder.enqueued_at is None:
                continue
            if holder.enqueued_at < before and (holder.eta is None or holder.eta < before):
                found[key] = (parts.task_name, holder.task_id, raw)
        return found, read

    def _since(self, key: str, raw: bytes, now: float) -> float:
        """When this record was first found without a message: by the last pass, or now."""
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
        done = Pass(
            done.candidates,
            done.suspects,
            done.freed,
            done.keys_read,
            done.messages_read,
            time.monotonic() - began,
            done.blind,
        )
        self.last = done
        return done
