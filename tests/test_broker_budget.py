"""A dedup call never waits on a Redis broker that is down longer than ``dedupe_call_budget``.

Each entry point is timed against a private broker stopped before the app made any publish
(its producers never connected), with the dedup store on the same server or on a Redis of
its own that is up; and against one lost after its producer connected. A plain Celery call
fails after its retry policy (0.6 s with Celery's); a dedup call raises kombu's
``OperationalError`` as a plain call does, within the budget plus :data:`MARGIN`, and says
which broker and which budget when the budget is what stopped it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.exceptions import OperationalError

import dedupe
from dedupe.demo.server import RedisServer
from dedupe.runs.runtime import runtime_of
from dedupe.values.keys import alive_key

from .conftest import RedisFactory
from .helpers import keys_with_prefix

BUDGET = 1.0
#: What a call may take past the budget: the connection attempt under way when it ran out
#: (a refused connect and redis-py's own short retries), and the tests' machine being busy.
MARGIN = 0.75
#: kombu retries connecting for ever under this policy: only the budget stops a call.
FOREVER = {"max_retries": None, "interval_start": 0.1, "interval_step": 0.1, "interval_max": 0.2}

Entry = Callable[[Any, Any], Any]


def _run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


#: Every producer entry point, called with (a unique DedupeTask, a DedupeTask not unique).
ENTRY_POINTS: dict[str, Entry] = {
    "DedupeTask.delay": lambda unique, _: unique.delay(1),
    "DedupeTask.apply_async": lambda unique, _: unique.apply_async((1,)),
    "delay_unique": lambda _, plain: plain.delay_unique(1),
    "dedupe.apply_async": lambda _, plain: dedupe.apply_async(plain, (1,)),
    "dedupe.apply_many": lambda _, plain: dedupe.apply_many(plain, [((1,), {}), ((2,), {})]),
    "dedupe.aapply_async": lambda _, plain: _run(dedupe.aapply_async(plain, (1,))),
    "dedupe.aapply_many": lambda _, plain: _run(
        dedupe.aapply_many(plain, [((1,), {}), ((2,), {})])
    ),
}


@pytest.fixture
def broker(redis_factory: RedisFactory) -> RedisServer:
    """A private Redis broker, stopped by the test."""
    return redis_factory()


@pytest.fixture(params=["store on the broker", "store apart"])
def store_url(request: pytest.FixtureRequest, broker: RedisServer, redis_url: str) -> str:
    """The dedup store: the broker's own server (down with it), or the session's (up)."""
    return broker.url if request.param == "store on the broker" else redis_url


@pytest.fixture
def tasks(
    make_app: Callable[..., Celery], broker: RedisServer, store_url: str
) -> Callable[..., tuple[Any, Any]]:
    """Call with settings: (a unique task, a task deduplicated on request) of a new app."""

    def build(**conf: Any) -> tuple[Any, Any]:
        app = make_app(
            broker=broker.url, dedupe_redis_url=store_url, dedupe_call_budget=BUDGET, **conf
        )

        @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
        def unique(x: int) -> int:
            return x

        @app.task(shared=False, base=dedupe.DedupeTask)
        def plain(x: int) -> int:
            return x

        if store_url != broker.url:
            # The store restored the broker's unacked messages already (as after the first
            # call of a deployment): the restore of a fresh store is the next test's.
            store = runtime_of(app).store
            store.mark_alive(alive_key(app.conf.dedupe_key_prefix), store.server_run() or b"1")
        return unique, plain

    return build


def _no_key_left(
    entry: str, task: Any, redis_client: redis.Redis, store_url: str, broker: RedisServer
) -> None:
    """The failed call freed its key (on a store that is up to be asked). Not checked for a
    batch: on a broker apart from the store, the calls after the one whose publish raised
    keep their provisional records (until dedupe_provisional_ttl), budget or not."""
    if store_url != broker.url and "many" not in entry:
        assert keys_with_prefix(redis_client, task.app.conf.dedupe_key_prefix) == []


def _timed(call: Callable[[], Any]) -> tuple[float, BaseException]:
    started = time.monotonic()
    with pytest.raises(OperationalError) as raised:
        call()
    return time.monotonic() - started, raised.value


def _called_on_a_stopped_broker(
    entry: str, unique: Any, plain: Any, broker: RedisServer
) -> BaseException:
    """Call ``entry`` with the broker down: the error, raised within the budget."""
    broker.stop()
    took, error = _timed(lambda: ENTRY_POINTS[entry](unique, plain))
    assert took < BUDGET + MARGIN, f"{entry} blocked {took:.2f} s"
    return error


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_call_on_a_broker_that_never_answered_raises_within_the_budget(
    tasks: Callable[..., tuple[Any, Any]],
    broker: RedisServer,
    store_url: str,
    redis_client: redis.Redis,
    entry: str,
) -> None:
    # Celery's retry policy (0.6 s) runs out first: kombu's own error, as a plain call's.
    unique, plain = tasks()
    _called_on_a_stopped_broker(entry, unique, plain, broker)
    _no_key_left(entry, unique, redis_client, store_url, broker)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_retry_policy_longer_than_the_budget_is_cut_at_the_budget_with_an_error_that_says_so(
    tasks: Callable[..., tuple[Any, Any]],
    broker: RedisServer,
    store_url: str,
    redis_client: redis.Redis,
    entry: str,
) -> None:
    unique, plain = tasks(task_publish_retry_policy=FOREVER)
    message = str(_called_on_a_stopped_broker(entry, unique, plain, broker))
    assert f"127.0.0.1:{broker.port}" in message  # which broker
    assert f"dedupe_call_budget={BUDGET}" in message  # which budget
    assert "Connection refused" in message  # why
    assert "raise dedupe_call_budget" in message  # what to do
    _no_key_left(entry, unique, redis_client, store_url, broker)


@pytest.mark.parametrize("store_url", ["store apart"], indirect=True)
def test_a_broker_lost_after_its_producer_connected_is_given_up_at_the_budget(
    tasks: Callable[..., tuple[Any, Any]], broker: RedisServer, store_url: str
) -> None:
    # kombu's retry of a publish on a connection that was up: the reconnects stop at the
    # budget too (on the broker's own server, the record's push fails first, as the store's).
    unique, _ = tasks(task_publish_retry_policy=FOREVER)
    unique.delay(0)
    broker.stop()
    took, error = _timed(lambda: unique.delay(1))
    assert took < BUDGET + MARGIN
    assert "dedupe_call_budget" in str(error)


def test_the_password_of_the_broker_stays_out_of_the_error(
    make_app: Callable[..., Celery], broker: RedisServer, redis_url: str
) -> None:
    app = make_app(
        broker=f"redis://:hunter2@127.0.0.1:{broker.port}/0",
        dedupe_call_budget=BUDGET,
        task_publish_retry_policy=FOREVER,
    )

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def unique(x: int) -> int:
        return x

    store = runtime_of(app).store
    store.mark_alive(alive_key(app.conf.dedupe_key_prefix), store.server_run() or b"1")
    broker.stop()
    _, error = _timed(lambda: unique.delay(1))
    message = str(error)
    assert "dedupe_call_budget" in message
    assert f"127.0.0.1:{broker.port}" in message
    assert "hunter2" not in message


def test_without_a_budget_a_call_fails_as_its_retry_policy_says(
    make_app: Callable[..., Celery], broker: RedisServer
) -> None:
    # dedupe_call_budget=0: Celery's retry policy alone bounds the call (0.6 s), as a plain
    # call's; not kombu's connect timeout of a channel opened outside the publish (6 s).
    app = make_app(broker=broker.url, dedupe_redis_url=broker.url, dedupe_call_budget=0)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def unique(x: int) -> int:
        return x

    broker.stop()
    took, _ = _timed(lambda: unique.delay(1))
    assert took < 0.6 + MARGIN


def test_a_call_on_a_fresh_store_apart_from_a_broker_that_is_down_raises_within_the_budget(
    make_app: Callable[..., Celery], broker: RedisServer, redis_url: str
) -> None:
    app = make_app(broker=broker.url, dedupe_redis_url=redis_url, dedupe_call_budget=BUDGET)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def unique(x: int) -> int:
        return x

    broker.stop()
    took, _ = _timed(lambda: unique.delay(1))
    assert took < BUDGET + MARGIN


def test_a_plain_call_after_a_call_that_ran_out_of_budget_retries_as_its_policy_says(
    make_app: Callable[..., Celery], broker: RedisServer
) -> None:
    # The budget's errback reaches kombu through the publish's retry policy, which kombu 5.7
    # copies into the transport options the pool's connections share: it must not cut the
    # retries of a later plain call short. (A broker lost after the producer connected:
    # kombu's publish ran, and copied the policy.)
    app = make_app(
        broker=broker.url,
        dedupe_call_budget=0.5,
        task_publish_retry_policy={
            "max_retries": 5,
            "interval_start": 0.2,
            "interval_step": 0.2,
            "interval_max": 0.2,
        },
    )

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def unique(x: int) -> int:
        return x

    store = runtime_of(app).store
    store.mark_alive(alive_key(app.conf.dedupe_key_prefix), store.server_run() or b"1")
    unique.delay(0)
    broker.stop()
    took, error = _timed(lambda: unique.delay(1))
    assert took < 0.5 + MARGIN
    assert "dedupe_call_budget" in str(error)
    took, error = _timed(lambda: unique.apply_async((1,), unique=False))
    assert took >= 0.9  # five retries 0.2 s apart
    assert "dedupe_call_budget" not in str(error)
