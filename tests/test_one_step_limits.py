"""On a Redis broker that is the dedup store, a call of a task with ``key_concurrency`` takes
its place in line and pushes its message in one script, one round trip; the message is what
kombu would push, and Celery's publish signals fire as for a plain call."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.app.task import Task as CeleryTask

import dedupe
from dedupe.producer.guard import keys_of_call
from dedupe.values.limits import LIMIT, limit_keys

from .conftest import RedisFactory

# What differs between two publishes of one call: its ids, and times taken from the clock.
_PER_MESSAGE = {"id", "root_id", "parent_id", "task_id", "correlation_id", "delivery_tag"}
_CLOCK = {"eta", "expires"}


def _normalised(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: ("<clock>" if key in _CLOCK and item is not None else _normalised(item))
            for key, item in value.items()
            if key not in _PER_MESSAGE and key != LIMIT
        }
    if isinstance(value, list):
        return [_normalised(item) for item in value]
    return value


def _message(raw: bytes) -> Any:
    message = json.loads(raw)
    message["body"] = json.loads(base64.b64decode(message["body"]))
    return _normalised(message)


@pytest.fixture
def private(make_app: Callable[..., Celery], redis_factory: RedisFactory) -> Iterator[Any]:
    """An app whose broker and dedup store are one Redis of the test's own (no worker, no
    other test's traffic), a task of it with ``key_concurrency=1``, and a client."""
    server = redis_factory()
    app = make_app(broker=server.url, dedupe_redis_url=server.url)
    assert dedupe.runs.runtime.installed(app).one_step  # type: ignore[union-attr]

    @app.task(shared=False, base=dedupe.DedupeTask, key_concurrency=1, unique_on=("x",))
    def job(x: int) -> int:
        return x

    client = redis.Redis.from_url(server.url)
    yield app, job, client
    client.close()


def _round_trips(client: redis.Redis, action: Callable[[], Any]) -> tuple[list[str], list[str]]:
    """The commands that reached Redis during ``action`` from clients (round trips), and
    those Lua scripts ran inside the server (client type "lua"), from MONITOR."""
    settings = client.get_connection_kwargs()
    reader = redis.Redis(host=settings["host"], port=settings["port"])
    signaller = redis.Redis(host=settings["host"], port=settings["port"])
    signaller.ping()  # connected now: its handshake must not land inside the count
    outside: list[str] = []
    inside: list[str] = []
    watching = threading.Event()
    marker = f"end-{threading.get_ident()}"

    def watch() -> None:
        with reader.monitor() as monitor:
            watching.set()
            for command in monitor.listen():
                if marker in command["command"]:
                    return
                name = command["command"].split(" ", 1)[0].lower()
                (inside if command.get("client_type") == "lua" else outside).append(name)

    watcher = threading.Thread(target=watch)
    watcher.start()
    assert watching.wait(5)
    time.sleep(0.05)  # MONITOR is registered once its reply came back
    action()
    signaller.echo(marker)
    watcher.join(10)
    reader.close()
    signaller.close()
    return outside, inside


def test_a_key_concurrency_call_takes_its_place_and_pushes_its_message_in_one_round_trip(
    private: Any,
) -> None:
    app, job, client = private
    job.delay(0)  # connections made, scripts loaded, the queue declared
    outside, inside = _round_trips(client, lambda: job.delay(1))
    assert outside == ["evalsha"]
    assert inside.count("lpush") == 1  # the message, pushed by the script
    assert client.llen(app.conf.task_default_queue) == 2
    _, keys = keys_of_call(job, (1,), None, app, {})
    assert client.zcard(limit_keys(keys.call)["line"]) == 1  # and its place in line


CALLS: dict[str, dict[str, Any]] = {
    "default queue": {},
    "routed queue": {"queue": "routed"},
    "priority": {"priority": 7},
    "countdown": {"countdown": 300},
    "expires": {"expires": 600},
}


@pytest.mark.parametrize("case", sorted(CALLS))
def test_a_key_concurrency_call_in_one_step_pushes_what_kombu_pushes(
    private: Any, case: str
) -> None:
    app, job, client = private
    default = app.conf.task_default_queue

    def pushed() -> dict[bytes, list[Any]]:
        names = [*client.keys(f"{default}*"), *client.keys("routed*")]
        lists = {name: client.lrange(name, 0, -1) for name in names}
        if names:
            client.delete(*names)
        return {name: [_message(raw) for raw in raws] for name, raws in lists.items()}

    # Celery's own apply_async, around DedupeTask's: the message kombu pushes for the call.
    CeleryTask.apply_async(job, (5,), **CALLS[case])
    by_kombu = pushed()
    job.apply_async((5,), **CALLS[case])
    by_dedupe = pushed()
    assert by_dedupe == by_kombu


def test_a_key_concurrency_call_in_one_step_fires_before_and_after_task_publish_once(
    private: Any, published: dict[str, Counter[str]]
) -> None:
    _, job, _ = private
    result = job.delay(1)
    assert published == {"before": Counter({result.id: 1}), "after": Counter({result.id: 1})}
