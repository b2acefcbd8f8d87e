"""The heartbeat thread: renews leases, survives a Redis that refuses for a while."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from celery import Celery

from dedupe.demo.server import RedisServer
from dedupe.recovery.unacked import RestartWatch
from dedupe.runs.heartbeat import Heartbeat
from dedupe.store.commands.leases import Lease
from dedupe.store.store import Store
from dedupe.values.keys import CallKeys
from dedupe.values.record import pack_running

from .conftest import RedisFactory
from .helpers import Lines, wait_for


@pytest.fixture
def server(redis_factory: RedisFactory) -> RedisServer:
    return redis_factory()


def held_lease(store: Store, key: str, lease_ms: int = 600) -> Lease:
    keys = CallKeys(key, key)
    assert store.claim(keys, "task-1", "run-1", lease_ms, "host", 1, time.time()) is None
    return Lease(key, "task-1", "run-1", lease_ms, pack_running("task-1", "run-1", "host", 1, 0))


def test_a_held_lease_outlives_its_length(server: RedisServer) -> None:
    store = Store(redis.Redis.from_url(server.url))
    heartbeat = Heartbeat(store)
    heartbeat.hold(held_lease(store, "k:{a}"))
    time.sleep(1.5)  # more than two leases
    assert store.client.exists("k:{a}")


def test_a_dropped_lease_lapses(server: RedisServer) -> None:
    store = Store(redis.Redis.from_url(server.url))
    heartbeat = Heartbeat(store)
    lease = held_lease(store, "k:{b}")
    heartbeat.hold(lease)
    heartbeat.drop(lease)
    wait_for(lambda: not store.client.exists("k:{b}"), timeout=2, message="lease lapsed")


@pytest.mark.slow
def test_the_heartbeat_survives_a_redis_that_refuses_for_a_while(server: RedisServer) -> None:
    store = Store(redis.Redis.from_url(server.url))
    heartbeat = Heartbeat(store)
    heartbeat.hold(held_lease(store, "k:{c}", lease_ms=1500))
    # Another client's slow script makes Redis answer BUSY to everyone else for 0.8 s.
    admin = redis.Redis.from_url(server.url)
    admin.config_set("lua-time-limit", "100")
    slow = (
        "local t = redis.call('TIME'); local start = t[1] * 1e6 + t[2]; "
        "repeat local n = redis.call('TIME') until n[1] * 1e6 + n[2] - start > 800000"
    )
    blocker = threading.Thread(target=lambda: redis.Redis.from_url(server.url).eval(slow, 0))
    blocker.start()
    blocker.join()
    # The thread is still there and still renewing: the key outlives its lease.
    time.sleep(2.0)
    assert store.client.exists("k:{c}")
    assert heartbeat.holding() == 1


def test_the_heartbeat_goes_on_renewing_when_its_data_loss_check_is_refused(
    server: RedisServer,
) -> None:
    # A user whose ACL covers the runs' keys and not the marker key: the restart watch's
    # check is refused at every look (not a "not now" error), and must not end the thread
    # that renews the runs.
    admin = redis.Redis.from_url(server.url)
    admin.acl_setuser("runs", enabled=True, nopass=True, keys=["k:*"], commands=["+@all"])
    client = redis.Redis(host="127.0.0.1", port=server.port, username="runs")
    store = Store(client)
    app = Celery("heartbeat", broker=server.url, set_as_current=False)
    watch = RestartWatch(app, store, "dedupe", lease=0.6, redelivery=1.0)
    heartbeat = Heartbeat(store, watch=watch, every=0.1)
    lease = held_lease(store, "k:{d}")
    try:
        with Lines("dedupe.keys") as lines:
            heartbeat.hold(lease)
            time.sleep(1.5)  # more than two leases, a dozen checks
        assert admin.exists("k:{d}")  # renewed all along
        assert heartbeat.holding() == 1
        assert "could not check for a dedup Redis data loss" in lines.text
        assert "permissions" in lines.text  # (the refusal, named)
    finally:
        # (The thread lives as long as the process: no more looks at a server that goes.)
        heartbeat.drop(lease)
        heartbeat._watch = None
        app.close()
