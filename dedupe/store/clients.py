"""The dedup store's Redis clients, made from its URL: one server (``redis://``,
``rediss://``, ``unix://``), a master that Redis Sentinel names (``sentinel://``), spelled
as Celery and kombu spell them, or a Redis Cluster (``redis+cluster://``).

The URL formats are read by :mod:`dedupe.values.urls`. Each connection asks the sentinels for
the master when it opens: after a failover, the next connection reaches the new master (and a
connection still open to a demoted one is dropped at its first READONLY reply, see
:mod:`dedupe.store.script_runner`).

A Cluster's client is redis-py's cluster client, which follows MOVED and ASK redirects and learns
the new layout after a failover or a slot migration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel

from dedupe.errors import ConfigurationError
from dedupe.values.urls import (
    SENTINEL_OPTIONS,
    ClusterTarget,
    SentinelTarget,
    cluster_target,
    sentinel_target,
)

__all__ = ["DedupRedis", "async_client", "sync_client"]

#: The store's client: one server's (or a Sentinel-named master's), or a Cluster's.
DedupRedis = redis.Redis | redis.cluster.RedisCluster


def sync_client(url: str, options: Mapping[str, Any], budget: float = 0.0) -> DedupRedis:
    """The redis-py client of the dedup store at ``url`` with ``options``; ``budget``: the
    call budget, which no wait of a Cluster's connections may outlast (the one server's
    script runner caps its own)."""
    cluster = cluster_target(url)
    if cluster is not None:
        settings = _cluster_settings(cluster, options, budget)
        node: Any = redis.cluster.ClusterNode  # (untyped in redis-py)
        startup = [node(host, port) for host, port in cluster.nodes]
        return redis.cluster.RedisCluster(startup_nodes=startup, **settings)
    target = sentinel_target(url, options)
    settings = {k: v for k, v in options.items() if k not in SENTINEL_OPTIONS}
    if target is None:
        return redis.Redis.from_url(url, **settings)
    sentinel_class: Any = redis.sentinel.Sentinel  # (untyped in redis-py)
    sentinel = sentinel_class(
        list(target.sentinels), sentinel_kwargs=_sentinel_settings(options, settings)
    )
    client: redis.Redis = sentinel.master_for(
        target.master_name, redis_class=redis.Redis, **_master_settings(target, settings)
    )
    return client


def async_client(
    url: str, options: Mapping[str, Any], pool_settings: Mapping[str, Any], budget: float = 0.0
) -> Any:
    """The ``redis.asyncio`` client of a Sentinel-managed or Cluster dedup store (None for
    one server: the caller builds that one's pool itself). ``pool_settings``: the asyncio
    pool's."""
    cluster = cluster_target(url)
    if cluster is not None:
        settings = _cluster_settings(cluster, {**options, **pool_settings}, budget)
        settings.pop("timeout", None)  # a BlockingConnectionPool's: a Cluster's has none
        startup = [redis.asyncio.cluster.ClusterNode(host, port) for host, port in cluster.nodes]
        return redis.asyncio.cluster.RedisCluster(startup_nodes=startup, **settings)
    target = sentinel_target(url, options)
    if target is None:
        return None
    settings = {k: v for k, v in options.items() if k not in SENTINEL_OPTIONS}
    sentinel_class: Any = redis.asyncio.sentinel.Sentinel  # (untyped in redis-py)
    sentinel = sentinel_class(
        list(target.sentinels), sentinel_kwargs=_sentinel_settings(options, settings)
    )
    merged = {**_master_settings(target, settings), **pool_settings}
    merged.pop("timeout", None)  # a BlockingConnectionPool's: Sentinel's pool has none
    return sentinel.master_for(target.master_name, redis_class=redis.asyncio.Redis, **merged)


def _cluster_settings(
    target: ClusterTarget, options: Mapping[str, Any], budget: float
) -> dict[str, Any]:
    settings = {k: v for k, v in options.items() if k not in SENTINEL_OPTIONS}
    if settings.pop("db", 0) not in (0, "0", None):
        raise ConfigurationError("a Redis Cluster has only database 0: drop 'db' from the options")
    if budget:
        for name in ("socket_timeout", "socket_connect_timeout"):
            configured = settings.get(name)
            settings[name] = budget if configured is None else min(configured, budget)
    for name, value in (
        ("username", target.username),
        ("password", target.password),
        ("ssl", target.ssl or None),
    ):
        if value is not None:
            settings.setdefault(name, value)
    return settings


def _master_settings(target: SentinelTarget, settings: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {"db": target.db, **settings}
    if target.password is not None:
        merged.setdefault("password", target.password)
    if target.username is not None:
        merged.setdefault("username", target.username)
    if target.ssl:
        merged.setdefault("ssl", True)
    return merged


def _sentinel_settings(options: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    # The sentinels' connections take the same timeouts as the master's unless told otherwise.
    own = dict(options.get("sentinel_kwargs") or {})
    for name in ("socket_timeout", "socket_connect_timeout"):
        if name in settings:
            own.setdefault(name, settings[name])
    return own
