"""Bulk unique enqueue: many calls decided in one round trip, results in call order."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.exceptions import EncodeError

import dedupe
from dedupe.demo.server import RedisServer
from dedupe.store.script_runner import ScriptRunner
from dedupe.values.header import HEADER, KeyHeader

from .conftest import RedisFactory, _delete_queue, unique_name
from .helpers import ROOT

QueueLength = Callable[[Celery], int]


@pytest.fixture
def tasks(app: Celery) -> Any:
    class Tasks:
        @staticmethod
        @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="bulk.remind")
        def remind(user: int, channel: str = "mail") -> None: ...

        @staticmethod
        @app.task(shared=False, name="bulk.plain")
        def plain(user: int) -> None: ...

    return Tasks


def test_a_batch_answers_in_call_order_and_deduplicates_within_itself(
    app: Celery, tasks: Any, queue_length: QueueLength
) -> None:
    results = dedupe.apply_many(
        tasks.remind, [((1,), {}), ((2,), {}), ((1,), {"channel": "mail"}), ((3,), {})]
    )
    assert [r.deduplicated for r in results] == [False, False, True, False]
    assert results[2].id == results[0].id
    assert results[2].holder is not None
    assert results[2].holder.task_id == results[0].id
    assert len({r.id for r in results}) == 3
    assert queue_length(app) == 3


def test_a_batch_call_whose_key_is_live_is_a_duplicate_of_its_holder(
    app: Celery, tasks: Any, queue_length: QueueLength
) -> None:
    live = tasks.remind.delay(7)
    results = dedupe.apply_many(tasks.remind, [((6,), {}), ((7,), {})])
    assert [r.deduplicated for r in results] == [False, True]
    assert results[1].id == live.id
    assert queue_length(app) == 2


def test_a_batch_of_a_task_of_any_base_is_deduplicated(
    app: Celery, tasks: Any, queue_length: QueueLength
) -> None:
    first = dedupe.apply_many(tasks.plain, [((1,), {}), ((2,), {})])
    again = dedupe.apply_many(tasks.plain, [((2,), {}), ((1,), {}), ((3,), {})])
    assert [r.deduplicated for r in again] == [True, True, False]
    assert [again[0].id, again[1].id] == [first[1].id, first[0].id]
    assert queue_length(app) == 3


def test_map_unique_calls_once_per_argument_tuple(
    app: Celery, tasks: Any, queue_length: QueueLength
) -> None:
    results = tasks.remind.map_unique([(1,), (2,), (2,)], countdown=30)
    assert [r.deduplicated for r in results] == [False, False, True]
    holder = dedupe.lookup(tasks.remind, (2,))
    assert holder is not None
    assert holder.eta is not None  # the options reached every call
    assert queue_length(app) == 2


def test_a_batch_awaited_from_asyncio_code(
    app: Celery, tasks: Any, queue_length: QueueLength
) -> None:
    async def main() -> list[dedupe.DedupeResult]:
        return await tasks.remind.amap_unique([(4,), (4,), (5,)])

    results = asyncio.run(main())
    assert [r.deduplicated for r in results] == [False, True, False]
    assert queue_length(app) == 2


def test_a_batch_refuses_one_task_id_for_all_its_calls(tasks: Any) -> None:
    with pytest.raises(dedupe.ConfigurationError, match="task_id"):
        dedupe.apply_many(tasks.remind, [((1,), {})], task_id="one-for-all")


def test_a_batch_under_raise_on_a_stopped_redis_publishes_nothing(
    make_app: Callable[..., Celery], redis_factory: RedisFactory, queue_length: QueueLength
) -> None:
    down = redis_factory(start=False)
    app = make_app(dedupe_redis_url=down.url, dedupe_on_redis_error="raise")

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def remind(user: int) -> None: ...

    with pytest.raises(dedupe.RedisUnavailable):
        remind.map_unique([(1,), (2,)])
    assert queue_length(app) == 0


# -- round trips, on a Redis broker that is the dedup store --------------------------------


@pytest.fixture
def store_broker(redis_factory: RedisFactory) -> RedisServer:
    return redis_factory()


def _round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the writes of the dedup client's script connections (one per round trip)."""
    sends = [0]
    send = ScriptRunner._send

    def counting(runner: ScriptRunner, command: bytes, commands: int = 1) -> None:
        sends[0] += 1
        send(runner, command, commands)

    monkeypatch.setattr(ScriptRunner, "_send", counting)
    return sends


def test_a_batch_on_the_brokers_redis_costs_two_round_trips_pushes_included(
    make_app: Callable[..., Celery],
    store_broker: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = make_app(broker=store_broker.url, dedupe_redis_url=store_broker.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def remind(user: int) -> None: ...

    assert dedupe.runs.runtime.installed(app).broker_is_store  # type: ignore[union-attr]
    remind.map_unique([(0,)])  # connects, loads the scripts
    client = redis.Redis.from_url(store_broker.url)
    client.config_resetstat()
    sends = _round_trips(monkeypatch)
    results = remind.map_unique([(user % 60,) for user in range(1, 101)])
    assert sends[0] == 2  # decide all, then push the accepted with their records
    stats = client.info("commandstats")
    # One enqueue_many.lua decides the 60 distinct keys; 59 publishes.
    assert stats["cmdstat_evalsha"]["calls"] == 1 + 59
    assert "cmdstat_lpush" not in stats or stats["cmdstat_lpush"]["calls"] == 59
    assert sum(not r.deduplicated for r in results) == 59
    queued = client.lrange(app.conf.task_default_queue, 0, -1)
    assert len(queued) == 60  # the warm-up's and 59 new
    ids = {json.loads(raw)["headers"]["id"] for raw in queued}
    assert {r.id for r in results} <= ids


def test_a_batchs_pushes_are_the_messages_kombu_would_push(
    make_app: Callable[..., Celery], store_broker: RedisServer
) -> None:
    app = make_app(broker=store_broker.url, dedupe_redis_url=store_broker.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def remind(user: int) -> None: ...

    (batched,) = remind.map_unique([(1,)], priority=3, countdown=5)
    dedupe.clear(remind, (1,))
    single = remind.apply_async((1,), priority=3, countdown=5)
    client = redis.Redis.from_url(store_broker.url)
    lists = list(client.keys(f"{app.conf.task_default_queue}*"))
    assert len(lists) == 1  # both went to the same priority list
    first, second = (json.loads(raw) for raw in client.lrange(lists[0], 0, -1)[::-1])
    for message in (first, second):
        message["headers"].pop("id"), message["headers"].pop("root_id")
        message["headers"].pop("eta")
        message["properties"].pop("correlation_id"), message["properties"].pop("delivery_tag")
        message["headers"].pop(HEADER)
    assert first["headers"].keys() == second["headers"].keys()
    assert first["properties"] == second["properties"]
    assert first["body"] == second["body"]
    assert batched.id != single.id


def test_a_batch_published_past_the_seam_still_writes_each_record(
    make_app: Callable[..., Celery], store_broker: RedisServer
) -> None:
    from kombu import Connection

    app = make_app(broker=store_broker.url, dedupe_redis_url=store_broker.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def remind(user: int) -> None: ...

    # A producer of another transport: kombu publishes without our seam, so the records of
    # the accepted calls are written after the fact, durable, not left provisional.
    with Connection("memory://") as connection, connection.Producer() as producer:
        results = remind.map_unique([(1,), (2,)], producer=producer)
    assert [r.deduplicated for r in results] == [False, False]
    for user in (1, 2):
        holder = dedupe.lookup(remind, (user,))
        assert holder is not None
        assert not holder.provisional
        assert holder.ttl is not None
        assert holder.ttl > 3000


def test_a_batchs_dedup_options_reach_every_call(
    make_app: Callable[..., Celery], store_broker: RedisServer
) -> None:
    # The calls of a batch are prepared alike: the first call's dedup options are every call's.
    app = make_app(broker=store_broker.url, dedupe_redis_url=store_broker.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def remind(user: int, channel: str) -> None: ...

    calls = [((user, channel), {}) for user in (1, 2) for channel in ("mail", "sms")]
    results = dedupe.apply_many(remind, calls, unique_on=("user",), unique_ttl=120)
    assert [r.deduplicated for r in results] == [False, True, False, True]
    for user in (1, 2):
        holder = dedupe.lookup(remind, (user, "any"), unique_on=("user",))
        assert holder is not None
        assert holder.ttl is not None
        assert 100 < holder.ttl <= 120


def test_a_batch_to_a_queue_never_declared_declares_it(
    make_app: Callable[..., Celery], store_broker: RedisServer
) -> None:
    # kombu declares a queue on a connection once: the batch skips only what it declared.
    app = make_app(broker=store_broker.url, dedupe_redis_url=store_broker.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def remind(user: int) -> None: ...

    fresh = unique_name("fresh")
    results = remind.map_unique([(1,), (2,), (3,)], queue=fresh)
    assert [r.deduplicated for r in results] == [False, False, False]
    client = redis.Redis.from_url(store_broker.url)
    assert client.llen(fresh) == 3
    bindings = client.smembers(f"_kombu.binding.{fresh}")
    assert any(fresh.encode() in binding for binding in bindings)


def test_a_batch_on_rabbitmq_to_a_queue_never_declared_declares_it(
    make_app: Callable[..., Celery], rabbitmq_url: str
) -> None:
    # RabbitMQ drops what no queue is bound for: each message would leave a key and no run.
    app = make_app(broker=rabbitmq_url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def remind(user: int) -> None: ...

    fresh = unique_name("fresh")
    try:
        results = remind.map_unique([(1,), (2,), (3,)], queue=fresh)
        assert [r.deduplicated for r in results] == [False, False, False]
        with app.connection_for_write() as connection:
            _, count, _ = connection.default_channel.queue_declare(fresh, passive=True)
        assert count == 3
    finally:
        _delete_queue(app, fresh)


def test_a_batch_on_rabbitmq_whose_publish_fails_midway_leaves_no_key_for_the_calls_after(
    make_app: Callable[..., Celery], rabbitmq_url: str
) -> None:
    # Each call's record is written before the batch's publishes; a set is a key's argument
    # but no JSON message's, so the second publish fails before it sends anything.
    app = make_app(broker=rabbitmq_url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def remind(user: object) -> None: ...

    queue = unique_name("midway")
    try:
        with pytest.raises(EncodeError):
            remind.map_unique([(1,), ({2},), (3,)], queue=queue)
        # The first went out with its record; the second and the third never will: a key
        # left for them would answer calls with task ids that never run.
        assert dedupe.lookup(remind, (1,)) is not None
        assert dedupe.lookup(remind, ({2},)) is None
        assert dedupe.lookup(remind, (3,)) is None
    finally:
        _delete_queue(app, queue)


# -- many producers at once ---------------------------------------------------------------

PRODUCER = textwrap.dedent(
    """
    import json, sys
    from celery import Celery
    import dedupe

    broker, prefix, queue, start = sys.argv[1:5]
    app = Celery("bulk_producer", broker=broker, set_as_current=False)
    app.conf.update(dedupe_key_prefix=prefix, task_default_queue=queue)
    dedupe.install(app)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="bulk.remind")
    def remind(user): ...

    users = [(int(start) + n) % 100 for n in range(250)]
    out = []
    for batch in range(0, 250, 100):
        chunk = users[batch : batch + 100]
        for user, result in zip(chunk, remind.map_unique([(u,) for u in chunk])):
            out.append([user, result.id, result.deduplicated, result.keys.call])
    print(json.dumps(out))
    """
)


def test_four_producers_of_a_thousand_calls_over_a_hundred_keys_queue_one_message_per_key(
    make_app: Callable[..., Celery], redis_url: str, redis_client: redis.Redis
) -> None:
    app = make_app(broker=redis_url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="bulk.remind")
    def remind(user: int) -> None: ...

    prefix, queue = app.conf.dedupe_key_prefix, app.conf.task_default_queue
    producers = [
        subprocess.Popen(
            [sys.executable, "-c", PRODUCER, redis_url, prefix, queue, str(start)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        for start in (0, 25, 50, 75)
    ]
    answers = [json.loads(p.communicate(timeout=120)[0]) for p in producers]
    assert all(p.returncode == 0 for p in producers)
    by_key: dict[str, set[str]] = {}
    for answer in answers:
        assert len(answer) == 250
        for user, task_id, _, key in answer:
            assert key == _key(remind, user)  # each result answers its own call
            by_key.setdefault(key, set()).add(task_id)
    assert len(by_key) == 100
    assert all(len(ids) == 1 for ids in by_key.values())  # one task id per key, everywhere
    messages: dict[str, int] = {}
    for raw in redis_client.lrange(queue, 0, -1):
        header = KeyHeader.read(json.loads(raw)["headers"])
        assert header is not None
        messages[header.keys.call] = messages.get(header.keys.call, 0) + 1
    assert messages == dict.fromkeys(by_key, 1)
    accepted = sum(not deduplicated for answer in answers for _, _, deduplicated, _ in answer)
    assert accepted == 100


def _key(task: Any, user: int) -> str:
    from dedupe.runs.runtime import runtime_of
    from dedupe.values.key_derivation import keys_for
    from dedupe.values.options import options_for

    runtime = runtime_of(task.app)
    options = options_for(task, task.name, runtime.config)
    return keys_for(runtime.config.key_prefix, task, task.name, options, (user,), {}).call


@pytest.mark.parametrize(
    "calls",
    [[(1,), (2,)], [1, 2], [((1,), {}), ((2,),)], [([1], {"x": 1}, "extra")], [("ab", {})]],
    ids=["bare-args", "bare-values", "no-kwargs", "three-parts", "string-args"],
)
def test_a_batch_call_that_is_no_args_kwargs_pair_is_refused_naming_it(
    app: Any, calls: list[Any]
) -> None:
    @app.task(shared=False, base=dedupe.DedupeTask, name="bulk.shape")
    def shape(x: int = 0) -> None: ...

    with pytest.raises(dedupe.ConfigurationError, match=r"apply_many\('bulk.shape'\): call \d+ is"):
        dedupe.apply_many(shape, calls)
