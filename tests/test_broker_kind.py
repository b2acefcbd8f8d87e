"""The app's kind of broker is decided once, from its URL, and asked everywhere: whether the
broker is the dedup store (a call's record and message in one script) has one answer,
whether the broker is named by host and port or by a unix socket's path."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import redis
from celery import Celery

import dedupe
from dedupe.brokers.choice import broker_of
from dedupe.brokers.other_broker import OtherBroker
from dedupe.brokers.redis_broker import RedisBroker
from dedupe.brokers.server import ServerAddress
from dedupe.runs.runtime import runtime_of

from .conftest import RedisFactory


def test_a_socket_broker_and_a_socket_store_on_one_path_are_one_server() -> None:
    broker = ServerAddress.of_broker("socket:///run/redis.sock", None, "/2")
    assert broker == ServerAddress.of_client({"path": "/run/redis.sock", "db": 2})


def test_a_socket_brokers_database_may_be_named_in_its_query() -> None:
    broker = ServerAddress.of_broker("socket:///run/redis.sock?virtual_host=3", None, "/")
    assert broker == ServerAddress.of_client({"path": "/run/redis.sock", "db": 3})


def test_servers_are_compared_as_spelled() -> None:
    broker = ServerAddress.of_broker("localhost", 6379, "/0")
    assert broker != ServerAddress.of_client({"host": "127.0.0.1", "port": 6379, "db": 0})
    assert broker == ServerAddress.of_client({"host": "localhost", "port": 6379, "db": 0})


def test_another_database_on_one_server_is_another_store() -> None:
    broker = ServerAddress.of_broker("h", 6380, "/1")
    assert broker != ServerAddress.of_client({"host": "h", "port": 6380, "db": 0})


def test_a_virtual_host_that_names_no_database_names_no_server() -> None:
    assert ServerAddress.of_broker("h", 6379, "/sales") is None


def test_the_redis_transports_urls_are_the_redis_broker() -> None:
    for url in ("redis://h:1/0", "rediss://h:1/0", "redis+socket:///tmp/r.sock"):
        assert isinstance(broker_of(Celery(broker=url, set_as_current=False)), RedisBroker)


def test_any_other_transport_is_the_other_broker() -> None:
    app = Celery(broker="amqp://guest@localhost:5672//", set_as_current=False)
    broker = broker_of(app)
    assert isinstance(broker, OtherBroker)
    assert broker.redelivery is None


def test_a_broker_on_the_stores_unix_socket_is_the_store(
    make_app: Callable[..., Celery], redis_factory: RedisFactory
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        socket = str(Path(folder) / "redis.sock")
        redis_factory("--unixsocket", socket, "--unixsocketperm", "700")
        app = make_app(broker=f"redis+socket://{socket}", dedupe_redis_url=f"unix://{socket}")
        client = redis.Redis(unix_socket_path=socket)

        @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
        def job(x: int) -> int:
            return x

        assert runtime_of(app).broker_is_store
        first, second = job.delay(1), job.delay(1)
        assert (first.deduplicated, second.deduplicated) == (False, True)
        assert client.llen(app.conf.task_default_queue) == 1
        client.close()
