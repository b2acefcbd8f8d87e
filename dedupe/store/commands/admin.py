"""The store's plain commands: a call's holder looked up or cleared (the web view, the CLI),
a beat entry's ticks claimed (and given up), and the server's settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis.cluster
from redis.commands.core import Script

from dedupe.store.redis_errors import reraise_unavailable
from dedupe.store.replies import first_holder
from dedupe.values.keys import CallKeys
from dedupe.values.record import Holder

from .base import StoreBase, integer_reply

__all__ = ["AdminCommands"]


class AdminCommands(StoreBase):
    """Commands of the client itself: lookup, clear, ticks; one script (free_tick.lua)."""

    _free_tick: Script

    @property
    def server(self) -> Mapping[str, Any] | None:
        """The connection settings of the store's one server (host, port, db or path); None
        for a Redis Cluster, whose keys are spread over many."""
        if isinstance(self.client, redis.cluster.RedisCluster):
            return None
        settings: Mapping[str, Any] = self.client.connection_pool.connection_kwargs
        return settings

    def lookup(self, keys: CallKeys) -> Holder | None:
        """The holder of a call's keys: the queued record first, else the running one."""
        return self._first_holder(keys.names, keys.call)

    def run_holder(self, keys: CallKeys) -> Holder | None:
        """The record of a call's run key: the run that holds it (the call's own record,
        queued or running, with unique_until="finished")."""
        return self._first_holder([keys.run], keys.run)

    def _first_holder(self, names: list[str], key: str) -> Holder | None:
        def read() -> Holder | None:
            with self.client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.get(name)
                    pipe.pttl(name)
                return first_holder(names, pipe.execute())

        with reraise_unavailable("lookup", key):
            return self._command(read)

    def claim_tick(self, key: str, claimant: bytes, ttl_ms: int) -> bool:
        """Claim one tick of a beat entry (:func:`dedupe.values.keys.tick_key`). True: this beat
        sends the tick; False: another beat claimed it first."""
        with reraise_unavailable("claim_tick", key):
            return bool(self._command(lambda: self.client.set(key, claimant, nx=True, px=ttl_ms)))

    def tick_claimant(self, key: str) -> bytes | None:
        """Who claimed a tick of a beat entry (None: nobody, or the claim expired)."""
        with reraise_unavailable("claim_tick", key):
            claimant = self._command(lambda: self.client.get(key))
        return claimant if isinstance(claimant, bytes) else None

    def free_tick(self, key: str, claimant: bytes) -> bool:
        """Give up a tick this beat claimed (:meth:`claim_tick`) and failed to send, if the
        claim is still its own. True if it was freed."""
        with reraise_unavailable("free_tick", key):
            reply = self._run(self._free_tick, [key], [claimant])
        return integer_reply("free_tick", reply) == 1

    def clear(self, keys: CallKeys) -> bool:
        """Delete a call's keys whoever holds them. True if anything was deleted."""
        self._forget(keys)
        with reraise_unavailable("clear", keys.call):
            return bool(self._command(lambda: self.client.delete(*keys.names)))
