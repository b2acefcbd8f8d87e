"""The start-up check that warns when the dedup Redis may evict live keys."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dedupe.demo.server import RedisServer
from dedupe.store.checks import eviction_risk

from .conftest import RedisFactory


@pytest.fixture
def server(redis_factory: RedisFactory) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_factory().url, decode_responses=True)
    yield client
    client.close()


def test_no_memory_limit_is_no_risk(server: redis.Redis) -> None:
    server.config_set("maxmemory-policy", "allkeys-lru")
    assert eviction_risk(server) is None


def test_noeviction_is_no_risk(server: redis.Redis) -> None:
    server.config_set("maxmemory", "100mb")
    server.config_set("maxmemory-policy", "noeviction")
    assert eviction_risk(server) is None


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl", "volatile-lru"])
def test_an_evicting_policy_under_a_limit_is_named_in_the_warning(
    server: redis.Redis, policy: str
) -> None:
    server.config_set("maxmemory", "100mb")
    server.config_set("maxmemory-policy", policy)
    warning = eviction_risk(server)
    assert warning is not None
    assert policy in warning
    assert "noeviction" in warning


def test_an_unreachable_server_is_not_a_crash(redis_server: RedisServer) -> None:
    client = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    assert eviction_risk(client) is None
