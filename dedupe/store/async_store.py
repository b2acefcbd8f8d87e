"""The producer's Redis round trips for asyncio code, on ``redis.asyncio``.

The same scripts, records and reply readers as :mod:`dedupe.store.store`, so sync and async callers
meet on the same keys. A client is bound to one event loop: the runtime keeps one store per
loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import FullJitterBackoff
from redis.commands.core import AsyncScript

from dedupe.values import defaults
from dedupe.values.keys import CallKeys
from dedupe.values.latest import LatestWrite
from dedupe.values.record import Holder, pack_owner
from dedupe.values.urls import SENTINEL_OPTIONS

from .clients import async_client
from .commands.base import DataLossBarrier
from .redis_errors import reraise_unavailable
from .replies import Requeue, first_holder, not_decided, read_cancel, read_enqueue, read_requeue
from .store import script_text

__all__ = ["AsyncStore"]

_T = TypeVar("_T")


class AsyncStore:
    """Enqueue, requeue, cancel and lookup, awaitable."""

    #: As :attr:`dedupe.store.store.Store.barrier` (the runtime sets the same one).
    barrier: DataLossBarrier | None = None

    def __init__(self, client: redis.asyncio.Redis, budget: float = defaults.CALL_BUDGET) -> None:
        self.client = client
        self._budget = budget or None
        self._enqueue = client.register_script(script_text("enqueue"))
        self._enqueue_latest = client.register_script(script_text("enqueue_latest"))
        self._requeue = client.register_script(script_text("requeue"))
        self._cancel = client.register_script(script_text("cancel"))

    @classmethod
    def from_url(
        cls, url: str, options: Mapping[str, Any], budget: float = defaults.CALL_BUDGET
    ) -> AsyncStore:
        """A store on its own connection pool, with the library's client defaults under
        ``options`` (``dedupe_redis_options``)."""
        # A sync redis-py Retry cannot drive an asyncio connection: keep ours unless an
        # asyncio one is given.
        retry = options.get("retry")
        if not isinstance(retry, Retry):
            # (Jittered exponential; every redis-py from 5.0 on has this class.)
            backoff = FullJitterBackoff(
                base=defaults.RETRY_BACKOFF_BASE, cap=defaults.RETRY_BACKOFF_CAP
            )
            retry = Retry(backoff, retries=defaults.RETRIES)
        settings = {
            **defaults.CLIENT_OPTIONS,
            **{k: v for k, v in options.items() if k != "retry" and k not in SENTINEL_OPTIONS},
        }
        settings.setdefault("max_connections", defaults.ASYNC_MAX_CONNECTIONS)
        settings.setdefault("timeout", defaults.ASYNC_POOL_TIMEOUT)
        managed = async_client(url, options, {**settings, "retry": retry}, budget)
        if managed is not None:  # Sentinel's master or a Cluster
            return cls(managed, budget)
        pool = redis.asyncio.BlockingConnectionPool.from_url(url, retry=retry, **settings)
        return cls(redis.asyncio.Redis(connection_pool=pool), budget)

    async def _within_budget(self, call: Awaitable[_T]) -> _T:
        """Await ``call``, retries included, for no longer than the call budget (inside
        reraise_unavailable: running out of it is Redis being unavailable)."""
        try:
            return await asyncio.wait_for(call, self._budget)
        except asyncio.TimeoutError:
            raise redis.TimeoutError(
                f"no reply from the dedup Redis within the call budget ({self._budget} s)"
            ) from None

    async def enqueue(self, keys: CallKeys, record: bytes, ttl_ms: int) -> Holder | None:
        return await self._decide(self._enqueue, keys, [keys.call], [record, ttl_ms])

    async def enqueue_latest(
        self, keys: CallKeys, record: bytes, ttl_ms: int, latest: LatestWrite
    ) -> Holder | None:
        """:meth:`dedupe.store.store.Store.enqueue_latest`: a duplicate leaves ``latest``."""
        args = [record, ttl_ms, *latest.argv()]
        return await self._decide(self._enqueue_latest, keys, [keys.call, keys.latest], args)

    async def _decide(
        self, script: AsyncScript, keys: CallKeys, names: list[str], args: list[Any]
    ) -> Holder | None:
        """Run an enqueue script (its marker key after ``names`` while the barrier is armed;
        the records restored and the script run again if the store lost its data)."""
        barrier = self.barrier if self.barrier is not None and self.barrier.armed() else None
        marked = [*names, barrier.marker] if barrier else names
        with reraise_unavailable("enqueue", keys.call):
            reply = await self._within_budget(script(keys=marked, args=args))
        if barrier is not None and not_decided(reply):
            # The restore reads the broker through kombu, which blocks: not on the loop.
            await asyncio.to_thread(barrier.restore)
            with reraise_unavailable("enqueue", keys.call):
                reply = await self._within_budget(script(keys=names, args=args))
        return read_enqueue(keys.call, reply)

    async def requeue(
        self, keys: CallKeys, task_id: str, token: str, record: bytes, ttl_ms: int
    ) -> Requeue:
        with reraise_unavailable("requeue", keys.call):
            reply = await self._within_budget(
                self._requeue(
                    keys=[keys.call, keys.run], args=[pack_owner(task_id), token, record, ttl_ms]
                )
            )
        return read_requeue(reply)

    async def cancel(self, keys: CallKeys, task_id: str) -> bool:
        with reraise_unavailable("cancel", keys.call):
            reply = await self._within_budget(
                self._cancel(keys=[keys.call], args=[pack_owner(task_id)])
            )
        return read_cancel(reply)

    async def lookup(self, keys: CallKeys) -> Holder | None:
        names = keys.names
        with reraise_unavailable("lookup", keys.call):
            async with self.client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.get(name)
                    pipe.pttl(name)
                replies = await pipe.execute()
        return first_holder(names, replies)

    async def close(self) -> None:
        await self.client.aclose()
