"""Enqueue cost with the dedup records on other Redis deployments, in the same rounds as a
plain publish and as records on a Redis of their own (the provisional path all take: the
broker is the throwaway Redis, the records live elsewhere): a Sentinel-named master and a
Redis Cluster (three masters with a replica each).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

import dedupe
from dedupe.demo.server import RedisServer
from tests.servers import ClusterSet, SentinelSet

from ._env import Timings, Variant, interleaved, make_app
from .enqueue import PLAIN

OWN = "own Redis"
SENTINEL = "Sentinel master"
CLUSTER = "Cluster"


def run(url: str, rounds: int, calls: int) -> Timings | None:
    """Microseconds per call of each variant, per round (None: no Sentinel set or cluster
    could start)."""
    try:
        sentinels = SentinelSet()
        sentinels.start()
        cluster = ClusterSet()
        cluster.start()
    except (FileNotFoundError, RuntimeError) as exc:
        print(f"no Sentinel set or Cluster, their rows are left out: {exc}")
        return None
    own = RedisServer()
    own.start()
    try:
        broker = redis.Redis.from_url(url)
        app = make_app(url)

        @app.task(shared=False)
        def plain(x: int) -> None: ...

        variants: dict[str, Variant] = {
            PLAIN: (
                lambda i: plain.apply_async((i,)),
                lambda: broker.delete(app.conf.task_default_queue),
            )
        }
        stores = {
            OWN: (own.url, {}),
            SENTINEL: (sentinels.url, {"master_name": sentinels.master_name}),
            CLUSTER: (cluster.url, {}),
        }
        for label, (store_url, options) in stores.items():
            variants.update(_variants(url, broker, label, store_url, options))
        return interleaved(variants, rounds, calls)
    finally:
        own.close()
        sentinels.close()
        cluster.close()


def _variants(
    url: str,
    broker: redis.Redis,
    label: str,
    store_url: str,
    options: dict[str, Any],
) -> dict[str, Variant]:
    app = make_app(url, dedupe_redis_url=store_url, dedupe_redis_options=options)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def unique(x: int) -> None: ...

    store: Any = dedupe.runs.runtime.runtime_of(app).store.client
    prefix = app.conf.dedupe_key_prefix

    def clear() -> None:
        broker.delete(app.conf.task_default_queue)
        keys = list(store.scan_iter(match=f"{prefix}:*", count=10_000))
        if keys:
            store.delete(*keys)
        unique.delay(-1)

    clear()
    accepted: Callable[[int], Any] = lambda i: unique.apply_async((i,))  # noqa: E731
    return {
        f"dedupe accepted, {label}": (accepted, clear),
        f"dedupe duplicate, {label}": (lambda i: unique.apply_async((-1,)), None),
    }
