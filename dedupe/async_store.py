"""The producer's Redis round trips for asyncio code, on ``redis.asyncio``.

The same scripts and records as :mod:`dedupe.store`, so sync and async callers meet on the
same keys. A client is bound to one event loop: the runtime keeps one store per loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from .keys import CallKeys
from .record import Holder, owner_of
from .store import first_holder, held_by, key_names, script_text, translated

__all__ = ["AsyncStore"]


class AsyncStore:
    """Enqueue, requeue, cancel and lookup, awaitable."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.client = client
        self._enqueue = client.register_script(script_text("enqueue"))
        self._requeue = client.register_script(script_text("requeue"))
        self._cancel = client.register_script(script_text("cancel"))

    @classmethod
    def from_url(
        cls, url: str, defaults: Mapping[str, Any], options: Mapping[str, Any]
    ) -> AsyncStore:
        # A sync redis-py Retry cannot drive an asyncio connection: keep ours unless an
        # asyncio one is given.
        retry = options.get("retry")
        if not isinstance(retry, Retry):
            retry = Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.2), retries=2)
        settings = {**defaults, **{k: v for k, v in options.items() if k != "retry"}}
        # A burst of calls (a web server under load) waits for a free connection rather
        # than failing with "Too many connections", which would read as Redis being down.
        # The wait is not a Redis timeout: an unreachable Redis fails each connection fast
        # (socket_connect_timeout), and only a long queue of callers waits this long.
        settings.setdefault("max_connections", 64)
        settings.setdefault("timeout", 30.0)
        pool = redis.asyncio.BlockingConnectionPool.from_url(url, retry=retry, **settings)
        return cls(redis.asyncio.Redis(connection_pool=pool))

    async def enqueue(self, keys: CallKeys, record: bytes, ttl_ms: int) -> Holder | None:
        with translated("enqueue"):
            reply = await self._enqueue(keys=[keys.record], args=[record, ttl_ms])
        return held_by(keys.record, reply)

    async def requeue(
        self, keys: CallKeys, task_id: str, token: str, record: bytes, ttl_ms: int
    ) -> int:
        with translated("requeue"):
            reply = await self._requeue(
                keys=[keys.record, keys.run], args=[owner_of(task_id), token, record, ttl_ms]
            )
        return int(reply)

    async def cancel(self, keys: CallKeys, task_id: str) -> bool:
        with translated("cancel"):
            return bool(await self._cancel(keys=[keys.record], args=[owner_of(task_id)]))

    async def lookup(self, keys: CallKeys) -> Holder | None:
        names = key_names(keys)
        with translated("lookup"):
            async with self.client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.get(name)
                    pipe.pttl(name)
                replies = await pipe.execute()
        return first_holder(names, replies)

    async def close(self) -> None:
        await self.client.aclose()
