"""The store's side of the reaper (:mod:`dedupe.runs.reaping`): queued records whose message
is gone freed, the one worker that sweeps, what each worker holds, and what the last pass
found; and the node name of each worker process (the web view shows it)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from redis.commands.core import Script

from dedupe.store.redis_errors import reraise_unavailable
from dedupe.store.replies import decoded
from dedupe.values.limits import limit_keys

from .base import StoreBase, raise_first_error

__all__ = ["ReapingCommands"]


class ReapingCommands(StoreBase):
    """reap.lua, and the plain commands of the reaper's lock, holds and suspects."""

    _reap: Script

    def reap(self, records: Sequence[tuple[str, bytes]]) -> list[bool]:
        """Free each ``(call key, queued record)`` that still holds these very bytes, in one
        round trip (per master); True where one was freed."""
        if not records:
            return []
        with reraise_unavailable("reap"):
            replies = self._run.call_many(self._reap, [([key], [raw]) for key, raw in records])
            raise_first_error(replies)
        return [reply == 1 for reply in replies]

    def in_lines(self, calls: Sequence[tuple[str, str]]) -> set[str]:
        """Of ``calls`` (call key, task id), the task ids whose call waits in its key's line
        (``key_concurrency``), held there with what publishes it: its message is in Redis,
        not in the broker."""
        if not calls:
            return set()

        def read() -> list[object]:
            with self.client.pipeline(transaction=False) as pipe:
                for key, task_id in calls:
                    pipe.hexists(limit_keys(key)["held"], task_id)
                return list(pipe.execute())

        with reraise_unavailable("in_lines"):
            found = self._command(read)
        return {task_id for (_, task_id), held in zip(calls, found, strict=True) if held}

    def take_reaper(self, key: str, node: bytes, ttl_ms: int) -> bool:
        """Take (or keep, for ``node`` holding it) the reaper's lock for ``ttl_ms``. True:
        ``node`` sweeps."""

        def take() -> bool:
            if self.client.set(key, node, nx=True, px=ttl_ms):
                return True
            # (Not atomic, and need not be: a lost race costs one pass, never a wrong free.)
            if self.client.get(key) == node:
                return bool(self.client.pexpire(key, ttl_ms))
            return False

        with reraise_unavailable("take_reaper", key):
            return bool(self._command(take))

    def report_holds(self, keys: tuple[str, str], task_ids: Collection[str], ttl_ms: int) -> None:
        """Say which task ids' messages one worker holds, for ``ttl_ms``; ``keys``: the set
        of holds keys, and the worker's (:func:`~dedupe.values.keys.holds_keys`)."""
        written, key = keys

        def write() -> None:
            # (Not a transaction: the two keys may sit in different Cluster slots.)
            with self.client.pipeline(transaction=False) as pipe:
                pipe.delete(key)
                if task_ids:
                    pipe.sadd(key, *task_ids)
                    pipe.pexpire(key, ttl_ms)
                    pipe.sadd(written, key)
                    pipe.pexpire(written, ttl_ms)
                pipe.execute()

        with reraise_unavailable("report_holds", key):
            self._command(write)

    def held(self, written: str) -> set[str]:
        """Every task id the live workers hold, read from the holds keys in ``written``;
        those gone (their worker dead, or holding nothing) are taken out of it."""

        def read() -> set[str]:
            keys = [decoded(key) for key in self.client.smembers(written)]
            with self.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.smembers(key)
                members = pipe.execute()
            gone = [key for key, found in zip(keys, members, strict=True) if not found]
            if gone:
                self.client.srem(written, *gone)
            return {decoded(member) for found in members for member in found}

        with reraise_unavailable("held", written):
            found: set[str] = self._command(read)
        return found

    def name_nodes(self, key: str, nodes: Mapping[str, str], ttl_ms: int) -> None:
        """Say which Celery node each of one worker's processes (``host:pid``) is, for
        ``ttl_ms`` (renewed by every live worker)."""

        def write() -> None:
            with self.client.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping={name: node.encode() for name, node in nodes.items()})
                pipe.pexpire(key, ttl_ms)
                pipe.execute()

        with reraise_unavailable("name_nodes", key):
            self._command(write)

    def nodes(self, key: str) -> dict[str, str]:
        """``host:pid`` -> Celery node name, as the live workers last said."""
        with reraise_unavailable("nodes", key):
            found = self._command(lambda: self.client.hgetall(key))
        return {decoded(name): decoded(node) for name, node in found.items()}

    def mark_suspects(self, key: str, suspects: Mapping[str, float], ttl_ms: int) -> None:
        """Keep what the last pass found without a message (call key -> when first found)
        for ``ttl_ms``, in place of what the pass before found."""

        def write() -> None:
            with self.client.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                if suspects:
                    pipe.hset(key, mapping={name: repr(at) for name, at in suspects.items()})
                    pipe.pexpire(key, ttl_ms)
                pipe.execute()

        with reraise_unavailable("mark_suspects", key):
            self._command(write)

    def suspects(self, key: str) -> dict[str, float]:
        """What the reaper's last pass found without a message: call key -> when first
        found (seconds since the epoch)."""
        with reraise_unavailable("suspects", key):
            found = self._command(lambda: self.client.hgetall(key))
        return {decoded(name): float(at) for name, at in found.items()}
