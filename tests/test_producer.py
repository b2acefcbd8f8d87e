"""Enqueue-time dedup against a real Redis broker and store (no worker consumes here)."""

from __future__ import annotations

import gc
import json
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import amqp
import msgpack
import pytest
import redis
from celery import Celery, Task
from celery.result import AsyncResult
from kombu.exceptions import OperationalError

import dedupe
from dedupe.demo.server import RedisServer
from dedupe.values.header import HEADER, KeyHeader
from dedupe.values.record import pack_owner

from .conftest import RedisFactory
from .helpers import FAILS_AT_ONCE, OLD_RESULT_CONSUMER, UNREACHABLE, keys_with_prefix, wait_for

QueueLength = Callable[[Celery], int]


@pytest.fixture
def tasks(app: Celery) -> Any:
    class Tasks:
        @staticmethod
        @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
        def sync_customer(customer_id: int, full: bool = False) -> int:
            return customer_id

        @staticmethod
        @app.task(shared=False, base=dedupe.DedupeTask)
        def report(day: str) -> str:
            return day

        @staticmethod
        @app.task(shared=False)
        def plain(x: int) -> int:
            return x

    return Tasks


@pytest.fixture
def stoppable_redis(redis_factory: RedisFactory) -> RedisServer:
    return redis_factory()


@pytest.fixture(params=[UNREACHABLE, "amqp://guest:guest@127.0.0.1:1//"])
def unreachable_broker(
    make_app: Callable[..., Celery], request: pytest.FixtureRequest
) -> tuple[Celery, Any]:
    """An app whose broker refuses connections (and a unique task of it): every publish fails.
    A Redis broker and an AMQP one: nothing needs to listen on port 1."""
    app = make_app(broker=request.param, **FAILS_AT_ONCE)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    return app, job


def broker_messages(client: redis.Redis, app: Celery) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in client.lrange(app.conf.task_default_queue, 0, -1)]


def test_a_duplicate_call_publishes_nothing_and_returns_the_holders_id(
    app: Celery, tasks: Any, queue_length: QueueLength
) -> None:
    first = tasks.sync_customer.delay(42)
    second = tasks.sync_customer.delay(42)
    assert second.id == first.id
    assert queue_length(app) == 1


def test_the_result_says_whether_the_call_was_deduplicated(tasks: Any) -> None:
    first = tasks.sync_customer.delay(42)
    second = tasks.sync_customer.delay(42)
    assert isinstance(first, AsyncResult)
    assert isinstance(second, dedupe.DedupeResult)
    assert (first.deduplicated, second.deduplicated) == (False, True)
    assert second.holder is not None
    assert second.holder.state == "queued"


def test_spellings_of_the_same_call_are_duplicates(
    app: Celery, tasks: Any, queue_length: QueueLength
) -> None:
    ids = {
        tasks.sync_customer.delay(7).id,
        tasks.sync_customer.delay(customer_id=7).id,
        tasks.sync_customer.apply_async((7,), {"full": False}).id,
        tasks.sync_customer.apply_async(kwargs={"customer_id": 7}).id,
    }
    assert len(ids) == 1
    assert queue_length(app) == 1


def test_different_arguments_are_separate_calls(
    app: Celery, tasks: Any, queue_length: QueueLength
) -> None:
    assert tasks.sync_customer.delay(1).id != tasks.sync_customer.delay(2).id
    assert tasks.sync_customer.delay(1, full=True).deduplicated is False
    assert queue_length(app) == 3


def test_a_task_that_is_not_unique_deduplicates_only_when_asked(
    app: Celery, tasks: Any, queue_length: QueueLength
) -> None:
    tasks.report.delay("2026-11-22")
    tasks.report.delay("2026-11-22")
    assert queue_length(app) == 2
    first = tasks.report.delay_unique("2026-11-22")
    second = tasks.report.apply_async_unique(args=("2026-11-22",))
    third = tasks.report.apply_async(("2026-11-22",), unique=True)
    assert first.id == second.id == third.id
    assert queue_length(app) == 3


def test_a_unique_call_leaves_publisher_confirms_on_for_the_channels_later_publishes(
    make_app: Callable[..., Celery], rabbitmq_url: str
) -> None:
    # The overlap path shadows basic_publish for one publish; py-amqp keeps confirm mode as
    # an instance attribute, which the shadow must hand back, not drop.
    app = make_app(broker=rabbitmq_url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def sync_customer(customer_id: int) -> int:
        return customer_id

    sync_customer.delay(1)
    with app.producer_or_acquire() as producer:
        publish = producer.channel.basic_publish
        assert publish.__func__ is amqp.Channel.basic_publish_confirm


def test_unique_false_per_call_opts_out(app: Celery, tasks: Any, queue_length: QueueLength) -> None:
    tasks.sync_customer.delay(5)
    tasks.sync_customer.apply_async((5,), unique=False)
    assert queue_length(app) == 2


def test_on_duplicate_raise_raises_already_queued_naming_the_holder(tasks: Any) -> None:
    first = tasks.sync_customer.delay(3)
    with pytest.raises(dedupe.AlreadyQueued) as caught:
        tasks.sync_customer.apply_async((3,), on_duplicate="raise")
    assert caught.value.task_id == first.id
    assert caught.value.state == "queued"
    assert "sync_customer" in str(caught.value)


def test_unique_on_per_call_ignores_the_other_arguments(tasks: Any) -> None:
    first = tasks.sync_customer.apply_async((9,), {"full": True}, unique_on=("customer_id",))
    second = tasks.sync_customer.apply_async((9,), {"full": False}, unique_on=("customer_id",))
    assert second.id == first.id


def test_unique_key_per_call_decides_the_key(tasks: Any) -> None:
    def by_parity(customer_id: int, full: bool = False) -> int:
        return customer_id % 2

    first = tasks.sync_customer.apply_async((2,), unique_key=by_parity)
    assert tasks.sync_customer.apply_async((4,), unique_key=by_parity).id == first.id
    assert tasks.sync_customer.apply_async((3,), unique_key=by_parity).id != first.id


def test_a_queued_record_lives_for_unique_ttl(app: Celery, tasks: Any) -> None:
    tasks.sync_customer.apply_async((11,), unique_ttl=30)
    holder = dedupe.lookup(tasks.sync_customer, (11,))
    assert holder is not None
    assert holder.ttl is not None
    assert 29 < holder.ttl <= 30


def test_a_countdown_extends_the_records_life_by_the_delay(tasks: Any) -> None:
    tasks.sync_customer.apply_async((12,), countdown=100, unique_ttl=30)
    holder = dedupe.lookup(tasks.sync_customer, (12,))
    assert holder is not None
    assert holder.ttl is not None
    assert holder.eta is not None
    assert 129 < holder.ttl <= 130
    assert 99 < holder.eta - time.time() <= 100


def test_an_eta_extends_the_records_life_too(tasks: Any) -> None:
    import datetime as dt

    eta = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=200)
    tasks.sync_customer.apply_async((13,), eta=eta, unique_ttl=30)
    holder = dedupe.lookup(tasks.sync_customer, (13,))
    assert holder is not None
    assert holder.ttl is not None
    assert 228 < holder.ttl <= 230


def test_a_message_that_expires_after_unique_ttl_keeps_its_key_until_it_expires(
    tasks: Any,
) -> None:
    tasks.sync_customer.apply_async((14,), expires=500, unique_ttl=10)
    holder = dedupe.lookup(tasks.sync_customer, (14,))
    assert holder is not None
    assert holder.ttl is not None
    assert 499 < holder.ttl <= 500


def test_a_message_that_expires_before_unique_ttl_frees_its_key_when_it_expires(
    tasks: Any,
) -> None:
    import datetime as dt

    expires = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=60)
    tasks.sync_customer.apply_async((15,), countdown=30, expires=expires)
    holder = dedupe.lookup(tasks.sync_customer, (15,))
    assert holder is not None
    assert holder.ttl is not None
    assert 58 < holder.ttl <= 60  # not unique_ttl (3600) plus the countdown


def test_a_tasks_own_expires_counts_too(app: Celery) -> None:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, expires=45)
    def short_lived(x: int) -> None: ...

    short_lived.delay(1)
    holder = dedupe.lookup(short_lived, (1,))
    assert holder is not None
    assert holder.ttl is not None
    assert 44 < holder.ttl <= 45


def test_arguments_are_never_stored_in_redis(
    app: Celery, tasks: Any, redis_client: redis.Redis
) -> None:
    result = tasks.sync_customer.delay(987654321)
    (key,) = keys_with_prefix(redis_client, app.conf.dedupe_key_prefix)
    # A queued record is [owner, nonce, enqueue time]: nothing of the arguments.
    owner, _nonce, enqueued_at = msgpack.unpackb(redis_client.get(key), raw=True)
    assert owner == pack_owner(result.id)
    assert isinstance(enqueued_at, float)
    assert b"987654321" not in key
    assert b"987654321" not in redis_client.get(key)


def test_the_key_travels_in_a_namespaced_message_header(
    redis_app: Celery, redis_client: redis.Redis
) -> None:
    app = redis_app

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def sync_customer(customer_id: int) -> None: ...

    result = sync_customer.delay(21)
    (message,) = broker_messages(redis_client, app)
    assert message["headers"][HEADER] == f"finished|3600.0|{result.keys.call}"
    header = KeyHeader.read(message["headers"])
    assert header is not None
    assert header.keys.call == result.keys.call
    assert header.until == "finished"
    assert message["headers"]["id"] == result.id


def test_a_window_calls_header_names_its_mode_and_its_run_lock(
    redis_app: Celery, redis_client: redis.Redis
) -> None:
    @redis_app.task(shared=False, base=dedupe.DedupeTask, unique=True, unique_until="window")
    def remind(user: int) -> None: ...

    result = remind.apply_async((1,), unique_ttl=60, expires=5)
    (message,) = broker_messages(redis_client, redis_app)
    header = KeyHeader.read(message["headers"])
    assert header is not None
    assert header.until == "window"
    assert header.keys.run == result.keys.call + ":run"
    holder = dedupe.lookup(remind, (1,), unique_until="window")
    assert holder is not None
    assert holder.ttl is not None
    assert 59 < holder.ttl <= 60  # a window is not shortened by expires


def test_an_unencodable_argument_raises_before_anything_is_written_or_sent(
    app: Celery, tasks: Any, redis_client: redis.Redis, queue_length: QueueLength
) -> None:
    with pytest.raises(dedupe.KeyDerivationError) as caught:
        tasks.sync_customer.delay(object())
    assert caught.value.task_name == tasks.sync_customer.name
    assert caught.value.argument == "customer_id"
    assert queue_length(app) == 0
    assert keys_with_prefix(redis_client, app.conf.dedupe_key_prefix) == []


@pytest.mark.slow
def test_a_failed_publish_leaves_no_record_and_the_error_reaches_the_caller(
    unreachable_broker: Any, redis_client: redis.Redis
) -> None:
    app, job = unreachable_broker
    with pytest.raises(OperationalError):
        job.delay(1)
    assert keys_with_prefix(redis_client, app.conf.dedupe_key_prefix) == []


@pytest.mark.slow
def test_a_failed_publish_with_a_task_id_that_is_not_a_string_leaves_no_record(
    unreachable_broker: Any, redis_client: redis.Redis
) -> None:
    app, job = unreachable_broker
    with pytest.raises(OperationalError):
        job.apply_async((1,), task_id=12345)
    assert keys_with_prefix(redis_client, app.conf.dedupe_key_prefix) == []


def test_a_task_id_that_is_not_a_string_owns_its_record_as_a_string(tasks: Any) -> None:
    first = tasks.sync_customer.apply_async((7,), task_id=uuid.UUID(int=7))
    holder = dedupe.lookup(tasks.sync_customer, (7,))
    assert holder is not None
    assert holder.task_id == first.id == str(uuid.UUID(int=7))


def test_eager_mode_runs_inline_and_leaves_no_record(
    make_app: Callable[..., Celery], redis_client: redis.Redis
) -> None:
    app = make_app(task_always_eager=True)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def double(x: int) -> int:
        return 2 * x

    result = double.delay(4)
    assert result.get() == 8
    assert result.deduplicated is False
    assert double.delay_unique(4).get() == 8
    assert keys_with_prefix(redis_client, app.conf.dedupe_key_prefix) == []


def test_redis_down_with_enqueue_publishes_anyway_and_warns(
    make_app: Callable[..., Celery],
    broker: str,
    stoppable_redis: RedisServer,
    queue_length: QueueLength,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app(
        broker=broker, dedupe_redis_url=stoppable_redis.url, dedupe_on_redis_error="enqueue"
    )

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    job.delay(1)
    stoppable_redis.stop()
    with caplog.at_level(logging.WARNING, logger="dedupe.redis"):
        result = job.delay(1)
    assert result.deduplicated is False
    assert queue_length(app) == 2
    assert f"{result.id}] is published without dedup: dedup Redis unavailable" in caplog.text


def test_redis_down_with_raise_raises_and_publishes_nothing(
    make_app: Callable[..., Celery],
    broker: str,
    stoppable_redis: RedisServer,
    queue_length: QueueLength,
) -> None:
    app = make_app(
        broker=broker, dedupe_redis_url=stoppable_redis.url, dedupe_on_redis_error="raise"
    )

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    stoppable_redis.stop()
    with pytest.raises(dedupe.RedisUnavailable) as caught:
        job.delay(1)
    assert caught.value.operation == "enqueue"
    assert queue_length(app) == 0


class Guarded:
    """A unique task whose dedup Redis is a private server, under one dedupe_on_redis_error."""

    def __init__(self, app: Celery, server: RedisServer, queue_length: QueueLength) -> None:
        self.app = app
        self.server = server
        self.client = redis.Redis.from_url(server.url)
        self.queue_length = queue_length

        @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
        def job(x: int) -> None: ...

        self.job = job

    def assert_policy_followed(self, cause: str) -> None:
        """A call under the refusal: raises (publishing nothing), or publishes without dedup."""
        before = self.queue_length(self.app)
        if self.app.conf.dedupe_on_redis_error == "raise":
            with pytest.raises(dedupe.RedisUnavailable, match=cause):
                self.job.delay(1)
            assert self.queue_length(self.app) == before
        else:
            assert self.job.delay(1).deduplicated is False
            assert self.queue_length(self.app) == before + 1


@pytest.fixture(params=["enqueue", "raise"])
def guarded(
    request: pytest.FixtureRequest,
    make_app: Callable[..., Celery],
    stoppable_redis: RedisServer,
    queue_length: QueueLength,
) -> Iterator[Guarded]:
    app = make_app(dedupe_redis_url=stoppable_redis.url, dedupe_on_redis_error=request.param)
    guarded = Guarded(app, stoppable_redis, queue_length)
    yield guarded
    guarded.client.close()


def test_redis_refusing_writes_at_its_memory_limit_counts_as_unavailable(
    guarded: Guarded,
) -> None:
    # noeviction at maxmemory answers OOM to every write: dedupe_on_redis_error decides.
    guarded.client.config_set("maxmemory-policy", "noeviction")
    guarded.client.config_set("maxmemory", 1)
    try:
        # (redis-py 8 names the class; older ones pass on the script error quoting -OOM)
        guarded.assert_policy_followed("OOM|OutOfMemory")
    finally:
        guarded.client.config_set("maxmemory", 0)


def test_redis_refusing_writes_it_cannot_persist_counts_as_unavailable(guarded: Guarded) -> None:
    # A failed snapshot with save points set makes Redis answer MISCONF to every write.
    client = guarded.client
    client.config_set("save", "3600 1")
    shutil.rmtree(guarded.server._dir)  # the snapshot cannot be written
    client.bgsave()
    wait_for(
        lambda: client.info("persistence")["rdb_last_bgsave_status"] == "err",
        message="the snapshot failed",
    )
    try:
        guarded.assert_policy_followed("MISCONF")
    finally:
        client.config_set("stop-writes-on-bgsave-error", "no")


def test_redis_busy_running_a_long_script_counts_as_unavailable(guarded: Guarded) -> None:
    guarded.job.delay(0)  # connected, scripts loaded
    guarded.client.config_set("lua-time-limit", 50)
    spin = (
        "local stop = redis.call('TIME')[1] + 3 while tonumber(redis.call('TIME')[1]) < stop do end"
    )
    spinner = threading.Thread(
        target=lambda: redis.Redis.from_url(guarded.server.url).eval(spin, 0)
    )
    spinner.start()
    try:
        wait_for(lambda: _answers_busy(guarded.server.url), message="Redis answers BUSY")
        guarded.assert_policy_followed("BUSY")
    finally:
        spinner.join()


def _answers_busy(url: str) -> bool:
    probe = redis.Redis.from_url(url)
    try:
        probe.ping()
    except redis.ResponseError as exc:
        return str(exc).startswith("BUSY")
    finally:
        probe.close()
    return False


def test_a_refusal_that_waiting_cannot_fix_raises_naming_the_operation_and_the_key(
    guarded: Guarded,
) -> None:
    # An ACL without EVALSHA: publishing past it under "enqueue" would hide the broken setup.
    client, job = guarded.client, guarded.job
    client.acl_setuser("default", enabled=True, commands=["-evalsha", "-eval"])
    try:
        with pytest.raises(dedupe.RedisCommandError) as caught:
            job.delay(1)
    finally:
        client.acl_setuser("default", enabled=True, commands=["+@all"])
    assert caught.value.operation == "enqueue"
    assert caught.value.key is not None
    assert caught.value.key.startswith(f"{guarded.app.conf.dedupe_key_prefix}:{{{job.name}:")
    assert "no permissions to run the 'evalsha' command" in str(caught.value)
    assert guarded.queue_length(guarded.app) == 0


def test_a_call_on_a_frozen_redis_waits_out_one_retry_cycle_not_two(
    make_app: Callable[..., Celery], stoppable_redis: RedisServer, queue_length: QueueLength
) -> None:
    # After a first write of unknown fate the call publishes without dedup; its follow-up
    # (confirm or cancel) would wait out the retries again for a record the provisional ttl
    # frees anyway. Counted in connections the frozen server took (each retry makes one).
    app = make_app(
        dedupe_redis_url=stoppable_redis.url,
        dedupe_redis_options={"socket_timeout": 0.2, "socket_connect_timeout": 0.2},
    )

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    job.delay(0)  # connected, scripts loaded
    stats = redis.Redis.from_url(stoppable_redis.url)
    before = stats.info("stats")["total_connections_received"]
    stoppable_redis.pause()
    try:
        assert job.delay(1).deduplicated is False
    finally:
        stoppable_redis.resume()
    # The first try goes out on the call's open connection; each of the 2 retries opens one.
    # (Counted on a connection opened after the resume: the server accepts those its freeze
    # held in the backlog before it, in order; on the old one INFO may come first.)
    counter = redis.Redis.from_url(stoppable_redis.url)
    received = counter.info("stats")["total_connections_received"] - 1  # (less its own)
    assert received - before == 2
    assert queue_length(app) == 2
    stats.close()
    counter.close()


def test_dedup_resumes_when_redis_comes_back(
    make_app: Callable[..., Celery],
    broker: str,
    stoppable_redis: RedisServer,
    queue_length: QueueLength,
) -> None:
    app = make_app(broker=broker, dedupe_redis_url=stoppable_redis.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    stoppable_redis.stop()
    job.delay(1)
    stoppable_redis.start()
    assert job.delay(1).deduplicated is False
    assert job.delay(1).deduplicated is True
    assert queue_length(app) == 2


def test_an_app_without_install_gets_a_clear_error(redis_url: str) -> None:
    app = Celery("not_installed", broker=redis_url, set_as_current=False)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    with pytest.raises(dedupe.NotInstalled, match=r"dedupe.install\(app\)"):
        job.delay(1)
    app.close()


def test_dedup_options_on_a_plain_call_are_refused(tasks: Any) -> None:
    with pytest.raises(dedupe.ConfigurationError, match="apply_async_unique"):
        tasks.report.apply_async(("x",), unique_ttl=5)


def test_the_standalone_guard_works_for_a_plain_task(
    app: Celery, tasks: Any, queue_length: QueueLength
) -> None:
    first = dedupe.apply_async(tasks.plain, args=(1,))
    second = dedupe.apply_async(tasks.plain, kwargs={"x": 1})
    assert (first.deduplicated, second.deduplicated) == (False, True)
    assert second.id == first.id
    assert queue_length(app) == 1


def test_the_standalone_guard_sends_a_task_name_this_process_does_not_know(
    redis_app: Celery, redis_client: redis.Redis, queue_length: QueueLength
) -> None:
    app = redis_app
    first = dedupe.apply_async("elsewhere.refresh", args=(5,), app=app)
    second = dedupe.apply_async("elsewhere.refresh", args=[5], app=app)
    assert second.id == first.id
    assert second.deduplicated
    (message,) = broker_messages(redis_client, app)
    assert message["headers"]["task"] == "elsewhere.refresh"
    assert queue_length(app) == 1


def test_the_standalone_guard_and_the_task_methods_share_keys(tasks: Any) -> None:
    first = tasks.sync_customer.delay(77)
    assert dedupe.apply_async(tasks.sync_customer, args=(77,)).id == first.id
    assert (
        dedupe.apply_async(tasks.sync_customer.name, args=(77,), app=tasks.sync_customer.app).id
        == first.id
    )


def test_the_standalone_guard_does_not_deduplicate_twice_through_a_unique_task(
    app: Celery, tasks: Any, queue_length: QueueLength
) -> None:
    result = dedupe.apply_async(tasks.sync_customer, args=(31,))
    assert result.deduplicated is False
    assert queue_length(app) == 1


def test_lookup_reports_the_holder_and_release_frees_the_key(tasks: Any) -> None:
    assert dedupe.lookup(tasks.sync_customer, (8,)) is None
    first = tasks.sync_customer.delay(8)
    holder = dedupe.lookup(tasks.sync_customer, kwargs={"customer_id": 8})
    assert holder is not None
    assert (holder.task_id, holder.state) == (first.id, "queued")
    assert dedupe.clear(tasks.sync_customer, (8,)) is True
    assert dedupe.clear(tasks.sync_customer, (8,)) is False
    assert tasks.sync_customer.delay(8).deduplicated is False


def test_revoking_through_the_returned_result_frees_the_key_at_once(tasks: Any) -> None:
    first = tasks.sync_customer.delay(15)
    first.revoke()
    assert dedupe.lookup(tasks.sync_customer, (15,)) is None
    assert tasks.sync_customer.delay(15).id != first.id


def test_a_duplicate_leaves_no_result_subscription(
    app: Celery, tasks: Any, redis_client: redis.Redis
) -> None:
    # Compared as sets: other tests' results may unsubscribe meanwhile (when collected).
    def subscriptions() -> set[bytes]:
        return set(redis_client.pubsub_channels("celery-task-meta-*"))

    accepted = tasks.sync_customer.delay(64)
    channel = f"celery-task-meta-{accepted.id}"
    assert redis_client.pubsub_channels(channel) == [channel.encode()]
    before = subscriptions()
    duplicates = [tasks.sync_customer.delay(64) for _ in range(5)]
    assert all(d.deduplicated for d in duplicates)
    assert subscriptions() - before == set()


def test_an_accepted_call_gets_a_random_uuid4_task_id(tasks: Any) -> None:
    ids = [tasks.sync_customer.delay(n).id for n in range(200)]
    assert len(set(ids)) == len(ids)
    for task_id in ids:
        parsed = uuid.UUID(task_id)
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
        assert str(parsed) == task_id  # the usual lower-case, hyphenated text form


def test_an_explicit_task_id_is_used_for_an_accepted_call(tasks: Any) -> None:
    result = tasks.sync_customer.apply_async((50,), task_id="my-own-id")
    assert result.id == "my-own-id"
    assert tasks.sync_customer.apply_async((50,), task_id="another-id").id == "my-own-id"


def test_the_same_explicit_task_id_twice_is_a_duplicate(
    app: Celery, tasks: Any, queue_length: QueueLength
) -> None:
    # Deterministic task ids are a dedup idiom of their own: the second call must not
    # publish a second message under the same id.
    first = tasks.sync_customer.apply_async((51,), task_id="report-51")
    second = tasks.sync_customer.apply_async((51,), task_id="report-51")
    assert (first.deduplicated, second.deduplicated) == (False, True)
    assert queue_length(app) == 1


def test_a_message_of_ours_sent_again_with_its_task_id_is_a_continuation(
    app: Celery, tasks: Any, queue_length: QueueLength
) -> None:
    # What retry_on_worker_lost does in the worker's main process: same id, same header.
    first = tasks.sync_customer.delay(60)
    headers = {HEADER: {"key": first.keys.call, "until": "finished", "ttl": 3600}}
    again = tasks.sync_customer.apply_async((60,), task_id=first.id, headers=headers)
    assert again.deduplicated is False
    assert queue_length(app) == 2
    holder = dedupe.lookup(tasks.sync_customer, (60,))
    assert holder is not None
    assert holder.task_id == first.id


def test_any_task_instance_works_with_the_standalone_guard_after_install(
    app: Celery, queue_length: QueueLength
) -> None:
    class Base(Task):  # type: ignore[type-arg]
        pass

    @app.task(shared=False, base=Base)
    def custom(x: int) -> None: ...

    assert dedupe.apply_async(custom, (1,)).deduplicated is False
    assert dedupe.apply_async(custom, (1,)).deduplicated is True
    assert queue_length(app) == 1


def test_a_shared_task_proxy_works_with_every_entry_point(
    app: Celery, queue_length: QueueLength
) -> None:
    from celery import shared_task
    from celery._state import _set_current_app, get_current_app

    @shared_task(base=dedupe.DedupeTask, unique=True, name=f"shared.sync.{app.main}")
    def sync(x: int) -> None: ...

    # A shared task resolves through the current app, as in a project with one app.
    previous = get_current_app()
    app.set_current()
    try:
        proxy = sync
        assert type(proxy).__name__ == "Proxy"
        first = dedupe.apply_async(proxy, (1,))
        holder = dedupe.lookup(proxy, (1,))
        assert holder is not None
        assert holder.task_id == first.id
        assert dedupe.clear(proxy, (1,)) is True
    finally:
        _set_current_app(previous)


def test_a_continuation_is_published_even_while_another_task_holds_the_key(
    app: Celery, tasks: Any, queue_length: QueueLength
) -> None:
    # The worker's main process re-sending a task after its child died: never refused.
    holder = tasks.sync_customer.delay(61)
    headers = {HEADER: {"key": holder.keys.call, "until": "finished", "ttl": 3600}}
    again = tasks.sync_customer.apply_async((61,), task_id="lost-child-task", headers=headers)
    assert again.deduplicated is False
    assert again.id == "lost-child-task"
    assert queue_length(app) == 2


@pytest.mark.slow
def test_a_continuation_whose_publish_fails_leaves_no_record(
    unreachable_broker: Any, redis_client: redis.Redis
) -> None:
    app, job = unreachable_broker
    key = f"{app.conf.dedupe_key_prefix}:{{{job.name}:0}}"
    headers = {HEADER: {"key": key, "until": "finished", "ttl": 3600}}
    with pytest.raises(OperationalError):
        job.apply_async((1,), task_id="continued", headers=headers)
    assert keys_with_prefix(redis_client, app.conf.dedupe_key_prefix) == []


def test_a_naive_eta_is_read_as_utc_when_the_app_is_utc(
    tasks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datetime as dt

    monkeypatch.setenv("TZ", "Asia/Tokyo")  # nine hours from UTC: a misread shows
    time.tzset()
    try:
        naive_eta = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) + dt.timedelta(
            seconds=100
        )
        tasks.sync_customer.apply_async((62,), eta=naive_eta, unique_ttl=30)
        holder = dedupe.lookup(tasks.sync_customer, (62,))
        assert holder is not None
        assert holder.ttl is not None
        assert 128 < holder.ttl <= 130
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.skipif(not OLD_RESULT_CONSUMER, reason="this Celery never blocks in __del__")
def test_a_dropped_result_does_no_redis_io_in_its_del_on_celery_before_5_7(
    tasks: Any, redis_client: redis.Redis
) -> None:
    # Before 5.7 a result's __del__ unsubscribed on the result connection at once, also when
    # the cyclic collector ran it inside a subscribe on that same connection: the call then
    # hung on redis-py's pubsub lock, for good (seen in a test run). Ours waits for the next
    # call instead.
    dropped = tasks.sync_customer.delay(70)
    channel = f"celery-task-meta-{dropped.id}".encode()
    del dropped
    gc.collect()
    assert redis_client.pubsub_channels(channel) == [channel]
    tasks.sync_customer.delay(71)
    assert redis_client.pubsub_channels(channel) == []


def test_a_dropped_results_channel_is_unsubscribed_by_the_next_call(
    tasks: Any, redis_client: redis.Redis
) -> None:
    dropped = tasks.sync_customer.delay(72)
    channel = f"celery-task-meta-{dropped.id}".encode()
    del dropped
    gc.collect()
    tasks.sync_customer.delay(73)
    assert redis_client.pubsub_channels(channel) == []


def test_a_duplicate_waited_on_weakly_and_collected_in_a_cycle_leaves_no_subscription(
    tasks: Any, redis_client: redis.Redis
) -> None:
    # The cyclic collector clears a weak waiter before running __del__: the waiter's entry
    # is empty by then, and Celery's own __del__ must still run to unsubscribe.
    holder = tasks.sync_customer.delay(74)
    duplicate = tasks.sync_customer.delay(74)
    assert duplicate.deduplicated
    channel = f"celery-task-meta-{holder.id}".encode()
    del holder
    gc.collect()
    duplicate.backend.add_pending_result(duplicate, weak=True)
    duplicate.then(lambda value, cycle=duplicate: cycle, weak=True)  # a reference cycle
    del duplicate
    gc.collect()
    tasks.sync_customer.delay(75)  # (Celery < 5.7: the next call unsubscribes)
    assert redis_client.pubsub_channels(channel) == []


def test_a_held_call_whose_publish_fails_warns_of_no_second_message(
    make_app: Callable[..., Celery], caplog: pytest.LogCaptureFixture
) -> None:
    # The overlap path (a dedup Redis of its own, a task of mostly accepted calls): the
    # enqueue's verdict is read at the push. A publish that fails before it (the broker cut)
    # sent nothing, so a "held" verdict read afterwards is no second message (the chaos run
    # logged that warning for calls that raised and never ran).
    holder_app = make_app(broker=None)
    dead = make_app(
        broker=UNREACHABLE, dedupe_key_prefix=holder_app.conf.dedupe_key_prefix, **FAILS_AT_ONCE
    )
    jobs = []
    for app in (holder_app, dead):

        @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="jobs.cut")
        def job(x: int) -> None: ...

        jobs.append(job)
    held = jobs[0].delay(1)
    with caplog.at_level(logging.DEBUG, logger="dedupe"), pytest.raises(OperationalError):
        jobs[1].delay(1)
    assert "two messages of one call" not in caplog.text
    assert dedupe.lookup(jobs[0], (1,)).task_id == held.id  # type: ignore[union-attr]


def test_delay_unique_on_a_task_of_another_base_names_the_task_and_the_fix(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app()

    @app.task(shared=False, name="jobs.plain_base")
    def plain(x: int) -> int:
        return x

    with pytest.raises(
        AttributeError,
        match=r"task 'jobs.plain_base' has no delay_unique: its base is not dedupe\.DedupeTask.*"
        r"base=dedupe\.DedupeTask.*dedupe\.apply_async\(task",
    ):
        plain.delay_unique(1)
    assert not hasattr(plain, "apply_async_unique")
