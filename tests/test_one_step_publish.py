"""On a Redis broker that is the dedup store, a call's record and its message are written by
one script in one round trip, and the message is byte for byte what kombu would push.

Ids, timestamps and the dedup header aside: the message the one-step path pushes equals the
one kombu pushes for the same call, for the default queue, a routed queue, a priority, an eta,
a countdown, ``expires`` and a chain member.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery, chain

import dedupe
from dedupe.values.header import HEADER

from .conftest import RedisFactory

# What differs between two publishes of one call: its ids, and times taken from the clock.
_PER_MESSAGE = {"id", "root_id", "parent_id", "task_id", "correlation_id", "delivery_tag"}
_CLOCK = {"eta", "expires"}


def _normalised(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: ("<clock>" if key in _CLOCK and item is not None else _normalised(item))
            for key, item in value.items()
            if key not in _PER_MESSAGE and key != HEADER
        }
    if isinstance(value, list):
        return [_normalised(item) for item in value]
    return value


def _message(raw: bytes) -> Any:
    message = json.loads(raw)
    body = base64.b64decode(message["body"])
    message["body"] = json.loads(body) if message["content-type"] == "application/json" else body
    return _normalised(message)


@pytest.fixture
def one_step_app(make_app: Callable[..., Celery]) -> Celery:
    app = make_app()  # a Redis broker on the dedup store's server and database
    assert dedupe.runs.runtime.installed(app).broker_is_store  # type: ignore[union-attr]
    return app


# The result backend's own traffic (a chain's result subscribes), as with plain Celery.
_NOT_THE_PUBLISH = {"config|resetstat", "subscribe", "unsubscribe"}


def _stats(client: redis.Redis) -> dict[str, int]:
    """Commands Redis ran since the last CONFIG RESETSTAT, publish traffic only."""
    counts = {
        name.removeprefix("cmdstat_"): int(stat["calls"])
        for name, stat in client.info("commandstats").items()
    }
    # CONFIG RESETSTAT is counted as "config" before Redis 7, "config|resetstat" since.
    return {
        name: count
        for name, count in counts.items()
        if name not in _NOT_THE_PUBLISH and name.split("|")[0] != "config"
    }


CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "default queue": lambda job, extra: job.apply_async((1,), **extra),
    "routed queue": lambda job, extra: job.apply_async((2,), queue="routed", **extra),
    "priority": lambda job, extra: job.apply_async((3,), priority=7, **extra),
    "eta": lambda job, extra: job.apply_async(
        (4,), eta=dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=300), **extra
    ),
    "countdown": lambda job, extra: job.apply_async((5,), countdown=300, **extra),
    "expires": lambda job, extra: job.apply_async((6,), expires=600, **extra),
    "chain member": lambda job, extra: chain(
        job.si(7).set(**extra), job.si(8).set(unique=False)
    ).apply_async(),
}


def _lists(client: redis.Redis, app: Celery) -> dict[bytes, list[bytes]]:
    default = app.conf.task_default_queue
    names = [*client.keys(f"{default}*"), *client.keys("routed*")]
    return {name: client.lrange(name, 0, -1) for name in names}


@pytest.mark.parametrize("case", sorted(CALLS))
def test_the_one_step_path_pushes_what_kombu_pushes(
    one_step_app: Celery, redis_client: redis.Redis, case: str
) -> None:
    @one_step_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> int:
        return x

    redis_client.delete("routed")
    plain = CALLS[case](job, {"unique": False})
    pushed_by_kombu = _lists(redis_client, one_step_app)
    for name in pushed_by_kombu:
        redis_client.delete(name)

    unique = CALLS[case](job, {"unique": True})
    pushed_by_dedupe = _lists(redis_client, one_step_app)

    assert unique.id != plain.id
    assert list(pushed_by_dedupe) == list(pushed_by_kombu)  # the same lists (priority, route)
    for name, messages in pushed_by_kombu.items():
        assert [_message(m) for m in pushed_by_dedupe[name]] == [_message(m) for m in messages]
    redis_client.delete("routed")


@pytest.mark.parametrize("case", sorted(CALLS))
def test_the_one_step_path_is_one_round_trip_with_no_push_of_its_own(
    make_app: Callable[..., Celery], redis_factory: RedisFactory, case: str
) -> None:
    # A broker of the test's own: the count is the server's, and a worker another test left
    # consuming from a shared server would add its BRPOPs to it.
    server = redis_factory()
    app = make_app(broker=server.url, dedupe_redis_url=server.url)
    assert dedupe.runs.runtime.installed(app).broker_is_store  # type: ignore[union-attr]
    client = redis.Redis.from_url(server.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> int:
        return x

    # Warm up: the script loaded, the queue declared, the producer connected.
    job.delay(0)
    CALLS[case](job, {"unique": False})
    client.config_resetstat()
    CALLS[case](job, {"unique": True})
    stats = _stats(client)
    client.close()
    # EVALSHA, and inside it one GET, one SET and one LPUSH: nothing else reached Redis.
    assert stats == {"evalsha": 1, "get": 1, "set": 1, "lpush": 1}


def test_a_duplicate_on_the_one_step_path_pushes_nothing(
    one_step_app: Celery, redis_client: redis.Redis
) -> None:
    @one_step_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> int:
        return x

    first = job.delay(1)
    second = job.delay(1)
    assert (first.deduplicated, second.deduplicated) == (False, True)
    assert second.id == first.id
    assert redis_client.llen(one_step_app.conf.task_default_queue) == 1


def test_a_task_of_mostly_duplicates_decides_before_building_its_message(
    one_step_app: Celery, redis_client: redis.Redis
) -> None:
    @one_step_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> int:
        return x

    job.delay(1)
    for _ in range(20):
        job.delay(1)
    job.delay(3)  # a key no duplicate has met yet (a second would be tracked, and remembered)
    redis_client.config_resetstat()
    published: list[str] = []

    def before(headers: Any = None, **_: Any) -> None:
        published.append(headers["id"])

    from celery import signals

    signals.before_task_publish.connect(before, weak=False)
    try:
        assert job.delay(3).deduplicated
    finally:
        signals.before_task_publish.disconnect(before)
    assert published == []  # no message was built for it
    assert _stats(redis_client) == {"evalsha": 1, "get": 1, "pttl": 1}
    # An accepted call of that task still writes its record with its message.
    accepted = job.delay(2)
    assert accepted.deduplicated is False
    assert redis_client.llen(one_step_app.conf.task_default_queue) == 3


def test_a_debug_log_says_which_path_a_call_took(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> int:
        return x

    with caplog.at_level(logging.DEBUG, logger="dedupe.calls"):
        result = job.delay(1)
    expected = "one-step" if str(app.conf.broker_url).startswith("redis") else "overlap"
    assert f"{result.id}] published ({expected} path)" in caplog.text


@pytest.mark.parametrize(
    "options", [{"debounce": 30}, {"on_duplicate": "replace"}], ids=["debounce", "replace"]
)
def test_a_debounced_or_replacing_call_is_one_round_trip_accepted_or_duplicate(
    make_app: Callable[..., Celery], redis_factory: RedisFactory, options: dict[str, Any]
) -> None:
    server = redis_factory()
    app = make_app(broker=server.url, dedupe_redis_url=server.url)
    client = redis.Redis.from_url(server.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, unique_on=["key"], **options)
    def job(key: str, value: int) -> int:
        return value

    job.delay("warm", 0)  # (the scripts loaded, the producer connected)
    client.config_resetstat()
    first = job.delay("k", 1)
    accepted = _stats(client)
    client.config_resetstat()
    second = job.delay("k", 2)
    duplicate = _stats(client)
    client.close()
    assert (first.deduplicated, second.deduplicated, second.id) == (False, True, first.id)
    # Accepted: the record and the message in one script; the duplicate: its arguments left
    # for the holder's run, in one script too.
    assert accepted["evalsha"] == 1
    assert accepted["lpush"] == 1
    assert duplicate["evalsha"] == 1
    assert duplicate["hset"] == 1
    assert "lpush" not in duplicate


def test_a_call_after_the_server_closed_its_idle_connection_is_published(
    make_app: Any, redis_factory: RedisFactory
) -> None:
    # Redis closes a connection idle past its timeout. The one-step script, written on the
    # closed connection, was answered by nothing: the call raised RedisUnavailable (a push
    # of unknown fate) though the server never saw it.
    server = redis_factory()
    client = redis.Redis.from_url(server.url)
    client.config_set("timeout", 1)
    app = make_app(broker=server.url, dedupe_redis_url=server.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    job.delay(1)  # (the script known, the connection made)
    time.sleep(2.5)
    assert not job.delay(2).deduplicated
    assert client.llen(app.conf.task_default_queue) == 2
