"""Start-up check: will the dedup Redis keep our keys until they expire?

Every key celery-dedupe writes carries a TTL, so under a memory limit both ``allkeys-*``
and ``volatile-*`` eviction policies may drop live keys: a dropped queued record lets a
duplicate in, a dropped running record is re-created by the heartbeat only after the fact.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
import redis.cluster

from .clients import DedupRedis
from .redis_errors import redis_errors

__all__ = ["eviction_risk"]

logger = logging.getLogger("dedupe.checks")

_CHECK_ERRORS: tuple[type[BaseException], ...] = (redis.ResponseError, *redis_errors)


def eviction_risk(client: DedupRedis) -> str | None:
    """A warning if the server (on a Redis Cluster: any master) may evict dedup keys, else
    None (also when it cannot tell)."""
    cluster: Any = client  # (the cluster client's node API is untyped)
    servers: list[Any] = (
        [cluster.get_redis_connection(node) for node in cluster.get_primaries()]
        if isinstance(client, redis.cluster.RedisCluster)
        else [client]
    )
    for server in servers:
        warning = _eviction_risk(server)
        if warning is not None:
            return warning
    return None


def _eviction_risk(server: Any) -> str | None:
    try:
        config = server.config_get("maxmemory*")
    except _CHECK_ERRORS as exc:
        # Managed Redis often disables CONFIG: nothing to check.
        logger.debug("cannot read the eviction settings of the dedup Redis: %r", exc)
        return None
    maxmemory = int(config.get("maxmemory", 0) or 0)
    policy = config.get("maxmemory-policy", "noeviction")
    if maxmemory == 0 or policy == "noeviction":
        return None
    return (
        f"the dedup Redis evicts keys under memory pressure (maxmemory={maxmemory}, "
        f"maxmemory-policy={policy}): dedup keys all carry a TTL and may be evicted while "
        f"live, letting duplicates in. Use maxmemory-policy noeviction, or a Redis of its "
        f"own (dedupe_redis_url)."
    )
