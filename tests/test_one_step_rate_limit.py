"""On a Redis broker that is the dedup store, a call of a task with ``key_rate_limit``
reserves its start and pushes its message in one script, one round trip (both limits too);
the script writes the message's eta, the reserved start's, in Celery's format; the message
is otherwise what kombu would push, and Celery's publish signals fire as for a plain call."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from importlib import resources
from typing import Any

import pytest
import redis
from celery import Celery, signals
from celery.app.task import Task as CeleryTask
from kombu import Exchange, Queue

import dedupe
from dedupe.producer.guard import keys_of_call
from dedupe.values.limits import limit_keys

from .conftest import RedisFactory
from .test_one_step_limits import _message, _round_trips

#: The rate of the tasks here: a period of an hour, so a test's second call is over it.
RATE = "1/h"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@pytest.fixture
def private(make_app: Callable[..., Celery], redis_factory: RedisFactory) -> Iterator[Any]:
    """An app whose broker and dedup store are one Redis of the test's own (no worker, no
    other test's traffic), a task of it with ``key_rate_limit``, one with both limits, and a
    client."""
    server = redis_factory()
    app = make_app(broker=server.url, dedupe_redis_url=server.url)
    assert dedupe.runs.runtime.installed(app).one_step  # type: ignore[union-attr]

    @app.task(shared=False, base=dedupe.DedupeTask, key_rate_limit=RATE, unique_on=("x",))
    def rated(x: int) -> int:
        return x

    @app.task(
        shared=False,
        base=dedupe.DedupeTask,
        key_rate_limit=RATE,
        key_concurrency=1,
        unique_on=("x",),
    )
    def paced(x: int) -> int:
        return x

    client = redis.Redis.from_url(server.url)
    yield app, rated, paced, client
    client.close()


def _pushed(app: Celery, client: redis.Redis) -> list[bytes]:
    """The raw messages on the default queue, oldest first; the queue emptied."""
    queue = app.conf.task_default_queue
    raws = list(reversed(client.lrange(queue, 0, -1)))
    client.delete(queue)
    return raws


def _eta(raw: bytes) -> Any:
    return json.loads(raw)["headers"]["eta"]


def _reserved_start(client: redis.Redis, task: Any, task_id: str) -> str:
    """The start reserved for ``task_id`` in its key's plan, as Celery writes an eta."""
    _, keys = keys_of_call(task, (1,), None, task.app, {})
    score = client.zscore(limit_keys(keys.call)["plan"], task_id)
    assert score is not None
    return (_EPOCH + timedelta(milliseconds=int(score))).isoformat(timespec="microseconds")


def test_a_call_over_its_rate_reserves_its_start_and_pushes_its_message_in_one_round_trip(
    private: Any,
) -> None:
    app, rated, _, client = private
    rated.delay(1)  # connections made, scripts loaded, the queue declared; the period's start
    outside, inside = _round_trips(client, lambda: rated.delay(1))
    assert outside == ["evalsha"]
    assert inside.count("lpush") == 1  # the message, pushed by the script
    assert client.llen(app.conf.task_default_queue) == 2


def test_a_call_with_both_limits_takes_its_start_place_and_push_in_one_round_trip(
    private: Any,
) -> None:
    app, _, paced, client = private
    paced.delay(1)
    outside, inside = _round_trips(client, lambda: paced.delay(1))
    assert outside == ["evalsha"]
    assert inside.count("lpush") == 1
    _, keys = keys_of_call(paced, (1,), None, app, {})
    assert client.zcard(limit_keys(keys.call)["line"]) == 2  # both calls have their place


@pytest.mark.parametrize("limits", ["rate", "both"])
def test_a_call_over_its_rate_is_pushed_with_the_eta_of_its_reserved_start(
    private: Any, limits: str
) -> None:
    app, rated, paced, client = private
    task = rated if limits == "rate" else paced
    task.delay(1)
    second = task.delay(1)
    assert _eta(_pushed(app, client)[1]) == _reserved_start(client, task, second.id)


def test_a_call_over_its_rate_is_otherwise_the_message_kombu_pushes_with_a_countdown(
    private: Any,
) -> None:
    app, rated, _, client = private
    rated.delay(1)
    _pushed(app, client)
    CeleryTask.apply_async(rated, (1,), countdown=3600)
    by_kombu = _message(_pushed(app, client)[0])
    rated.delay(1)
    assert _message(_pushed(app, client)[0]) == by_kombu


def test_a_call_within_its_rate_is_the_message_kombu_pushes_with_no_eta(private: Any) -> None:
    app, rated, _, client = private
    CeleryTask.apply_async(rated, (1,))
    by_kombu = _pushed(app, client)[0]
    rated.delay(1)
    by_dedupe = _pushed(app, client)[0]
    assert _eta(by_dedupe) is None
    assert _message(by_dedupe) == _message(by_kombu)


def test_a_call_whose_own_countdown_passes_its_start_keeps_its_own_eta(private: Any) -> None:
    app, rated, _, client = private
    rated.delay(1)
    _pushed(app, client)
    before = datetime.now(timezone.utc)
    rated.apply_async((1,), countdown=7200)  # (the next free start is an hour away)
    eta = datetime.fromisoformat(_eta(_pushed(app, client)[0]))
    assert before + timedelta(seconds=7200) <= eta <= before + timedelta(seconds=7260)


def test_a_call_over_its_rate_fires_before_and_after_task_publish_once(
    private: Any, published: dict[str, Counter[str]]
) -> None:
    _, rated, _, _ = private
    rated.delay(1)
    for counted in published.values():
        counted.clear()  # (the call within the rate: counted in other tests)
    result = rated.delay(1)
    assert published == {"before": Counter({result.id: 1}), "after": Counter({result.id: 1})}


def test_after_task_publish_sees_the_eta_that_was_pushed(private: Any) -> None:
    app, rated, _, client = private
    rated.delay(1)
    _pushed(app, client)
    etas: list[Any] = []

    def after(headers: Any = None, **_: Any) -> None:
        etas.append(headers["eta"])

    signals.after_task_publish.connect(after, weak=False)
    try:
        rated.delay(1)
    finally:
        signals.after_task_publish.disconnect(after)
    assert etas == [_eta(_pushed(app, client)[0])]
    assert etas[0] is not None


def _instants() -> list[int]:
    """Epoch ms to format: leap days and the days around them (2000 is a leap year, 1900 and
    2100 are not), every month's last and first ms, year ends, and random ones."""
    days = [(1970, 1, 1), (1972, 2, 29), (2000, 2, 29), (2000, 3, 1), (2100, 2, 28)]
    days += [(2100, 3, 1), (2024, 2, 29), (2023, 2, 28), (2023, 3, 1), (2399, 12, 31)]
    days += [(year, month, 1) for year in (1999, 2000, 2023, 2024, 2100) for month in range(1, 13)]
    instants = []
    for year, month, day in days:
        start = datetime(year, month, day, tzinfo=timezone.utc)
        ms = int(start.timestamp()) * 1000
        instants += [ms, ms - 1, ms + 86_399_999]  # its first ms, the day before's last, its last
    generator = random.Random(1)
    instants += [generator.randrange(0, 13_569_465_600_000) for _ in range(2000)]  # to 2400
    return [ms for ms in instants if ms >= 0]


def test_the_scripts_write_an_eta_as_python_formats_the_same_utc_instant(
    redis_client: redis.Redis,
) -> None:
    prelude = (resources.files("dedupe.store") / "lua" / "_prelude.lua").read_text()
    script = (
        prelude + "\nlocal out = {}\nfor i = 1, #ARGV do out[i] = iso_utc(tonumber(ARGV[i])) end"
    )
    script += "\nreturn out"
    instants = _instants()
    written = redis_client.eval(script, 0, *instants)
    expected = [
        (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="microseconds") for ms in instants
    ]
    assert [text.decode() for text in written] == expected


def test_a_call_over_its_rate_to_queues_of_different_expiries_takes_its_start_first_with_its_eta(
    make_app: Callable[..., Celery], redis_factory: RedisFactory, tag: str
) -> None:
    # One script extends one expiry: the start first, then kombu's pushes, its eta set here.
    server = redis_factory()
    exchange = Exchange(f"both-{tag}", type="topic")  # (a direct one goes to its queue alone)
    short, long = (
        Queue(f"{name}-{tag}", exchange, routing_key=tag, expires=seconds)
        for name, seconds in (("short", 600), ("long", 1200))
    )
    app = make_app(broker=server.url, dedupe_redis_url=server.url, task_queues=[short, long])

    @app.task(shared=False, base=dedupe.DedupeTask, key_rate_limit=RATE, unique_on=("x",))
    def rated(x: int) -> int:
        return x

    client = redis.Redis.from_url(server.url)
    try:
        rated.apply_async((1,), queue=long.name)  # (declared on the producer's channel)
        rated.apply_async((1,), queue=short.name)
        messages = client.lrange(short.name, 0, -1)
        assert client.llen(long.name) == 2  # (both calls went to both queues)
        eta = datetime.fromisoformat(_eta(messages[0]))
        task_id = json.loads(messages[0])["headers"]["id"]
        reserved = datetime.fromisoformat(_reserved_start(client, rated, task_id))
        assert abs((eta - reserved).total_seconds()) < 1.0  # (the host's clock, not Redis's)
    finally:
        client.close()
