"""key_rate_limit="N/s": runs of one key start at most N per period across all workers;
calls beyond it are published with a countdown to the next free start, and a run that
finds the period full (messages bunched at a worker) goes again for the next free start.
Every call is accepted and runs. Real Redis, real prefork workers; the runs' start times
are written by the tasks (RunLog)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.common import Broadcast
from kombu.exceptions import OperationalError

import dedupe
from dedupe.producer.guard import keys_of_call
from dedupe.store.store import Store
from dedupe.values.config import DedupeConfig
from dedupe.values.limits import LIMIT, LimitHeader, Rate, limit_keys
from dedupe.values.options import resolve

from .conftest import RedisFactory
from .helpers import FAILS_AT_ONCE, UNREACHABLE, WorkerProcess, keys_with_prefix
from .proxies import CuttingProxy

pytestmark = [pytest.mark.slow]

_CONFIG = DedupeConfig(redis_url="")
#: What a start's time, as the task writes it, may lag the moment its run was let start
#: (the prerun's round trip and the pool's own work): windows are this much shorter.
_LOG_LAG = 0.05


def most_starts_within(starts: list[float], seconds: float) -> int:
    """The largest number of starts in any window of ``seconds`` (half-open)."""
    starts = sorted(starts)
    most = 0
    for index, first in enumerate(starts):
        most = max(most, sum(1 for later in starts[index:] if later - first < seconds))
    return most


@pytest.fixture
def two_workers(worker_app: Any, tag: str) -> Iterator[str]:
    """Two workers of two processes each, on a queue of the test's own."""
    queue = f"rate-{tag}"
    started = [WorkerProcess(worker_app.app, {"DEDUPE_TEST_QUEUE": queue}) for _ in range(2)]
    try:
        for worker in started:
            worker.start()
        yield queue
    finally:
        for worker in started:
            worker.stop()


def six_calls(worker_app: Any, tag: str, queue: str) -> list[Any]:
    return [worker_app.two_per_second.apply_async((tag, index), queue=queue) for index in range(6)]


def test_six_calls_all_run_never_more_than_two_starts_in_any_second(
    worker_app: Any, tag: str, two_workers: str
) -> None:
    results = six_calls(worker_app, tag, two_workers)
    assert [result.deduplicated for result in results] == [False] * 6
    assert [result.get(timeout=30) for result in results] == list(range(6))
    runs = worker_app.runlog(tag).runs()
    assert sorted(run[0] for run in runs) == sorted(result.id for result in results)
    assert most_starts_within([start for _, start, _ in runs], 1.0 - _LOG_LAG) <= 2


def test_calls_beyond_the_rate_are_published_with_a_countdown_to_their_start(
    worker_app: Any, tag: str, redis_client: redis.Redis
) -> None:
    queue = f"rate-idle-{tag}"  # (no worker: the messages stay as they were published)
    sent_at = time.time()
    try:
        results = six_calls(worker_app, tag, queue)
        messages = [json.loads(raw) for raw in reversed(redis_client.lrange(queue, 0, -1))]
    finally:
        redis_client.delete(queue)
    assert [message["headers"]["id"] for message in messages] == [r.id for r in results]
    delays = [_seconds_to(message["headers"]["eta"], sent_at) for message in messages]
    assert delays[:2] == [0.0, 0.0]
    # Two per second: the third and fourth a second on, the last two two seconds on.
    assert all(0.9 <= delay <= 1.5 for delay in delays[2:4]), delays
    assert all(1.9 <= delay <= 2.5 for delay in delays[4:]), delays


def _seconds_to(eta: str | None, since: float) -> float:
    if eta is None:
        return 0.0
    return datetime.fromisoformat(eta).timestamp() - since


def test_messages_bunched_at_a_worker_still_start_within_the_rate(
    worker_app: Any, tag: str, two_workers: str
) -> None:
    # Messages sent past the producer's schedule (plain Celery calls carrying the limit's
    # header, all due now: as a worker that was down would get them) are held at the start.
    scheduled = six_calls(worker_app, tag, two_workers)
    _, keys = keys_of_call(worker_app.two_per_second, (tag, 0), None, None, {})
    headers = {LIMIT: LimitHeader("rate", keys.call, 2, 1.0, 0.0).encode()}
    bunched = [
        worker_app.app.send_task(
            worker_app.two_per_second.name, (tag, 10 + index), queue=two_workers, headers=headers
        )
        for index in range(4)
    ]
    for result in [*scheduled, *bunched]:
        result.get(timeout=40)
    runs = worker_app.runlog(tag).runs()
    assert len(runs) == 10
    assert most_starts_within([start for _, start, _ in runs], 1.0 - _LOG_LAG) <= 2


def test_celerys_rate_limit_syntax_is_read_as_celery_reads_it() -> None:
    def rate(value: Any) -> Rate | None:
        return resolve(None, "t", _CONFIG, {"key_rate_limit": value}).rate

    assert rate("2/s") == Rate(2, 1.0)
    assert rate("10/m") == Rate(10, 60.0)
    assert rate("100/h") == Rate(100, 3600.0)
    assert rate("3") == Rate(3, 1.0)  # (no unit: per second, as Celery's rate())


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"key_rate_limit": "2/d"}, '"<N>/s", "<N>/m" or "<N>/h"'),
        ({"key_rate_limit": "0.5/s"}, "whole number of starts"),
        ({"key_rate_limit": "2/s", "unique_until": "window"}, "unique_until has no meaning"),
        ({"key_rate_limit": "2/s", "debounce": 1}, "debounce has no meaning"),
    ],
)
def test_an_invalid_rate_limit_is_refused_naming_the_task_and_the_fix(
    options: dict[str, Any], says: str
) -> None:
    with pytest.raises(dedupe.ConfigurationError, match=r"task 'proj\.bad'") as caught:
        resolve(None, "proj.bad", _CONFIG, options)
    assert says in str(caught.value)


@pytest.mark.parametrize("limits", [{}, {"key_concurrency": 1}], ids=["rate", "both"])
def test_a_call_whose_publish_fails_gives_its_start_back(
    make_app: Callable[..., Celery], redis_client: redis.Redis, limits: dict[str, int]
) -> None:
    # Its start would otherwise stay reserved in the key's plan for a period, for a
    # message that never exists: the next call would wait a period for nothing.
    app = make_app(broker=UNREACHABLE, **FAILS_AT_ONCE)

    @app.task(shared=False, base=dedupe.DedupeTask, key_rate_limit="1/m", **limits)
    def job(x: int) -> None: ...

    with pytest.raises(OperationalError):
        job.delay(1)
    assert keys_with_prefix(redis_client, app.conf.dedupe_key_prefix) == []


def test_a_call_pushed_in_two_steps_on_the_redis_broker_gives_its_start_back_if_its_push_fails(
    make_app: Callable[..., Celery], redis_factory: RedisFactory
) -> None:
    # A fanout: one script cannot push it, so its start is reserved first, then kombu
    # publishes it; the broker's connection is cut as it does.
    server = redis_factory()
    proxy = CuttingProxy(server.port)
    try:
        app = make_app(broker=proxy.url, dedupe_redis_url=proxy.url, task_publish_retry=False)

        @app.task(shared=False, base=dedupe.DedupeTask, key_rate_limit="1/m")
        def job(x: int) -> None: ...

        fanout = Broadcast(f"fanout-{app.conf.dedupe_key_prefix}")
        with app.connection_for_write() as connection:  # (a consumer's queue bound to it)
            fanout(connection.default_channel).declare()
        proxy.cut_at = (b"PUBLISH", fanout.exchange.name.encode())
        with pytest.raises(OperationalError):
            job.apply_async((1,), queue=fanout, declare=[fanout])
        assert proxy.cuts == 1
        client = redis.Redis(port=server.port)
        assert keys_with_prefix(client, app.conf.dedupe_key_prefix) == []
    finally:
        proxy.close()


def test_a_run_that_finds_the_period_full_waits_for_the_next_free_start(
    store: Store, tag: str
) -> None:
    keys = limit_keys(f"test:{{{tag}}}")
    starts = [store.next_start(keys, f"run{n}", 2, 1000, token="t") for n in range(3)]
    assert starts[:2] == [0, 0]
    assert 900 <= starts[2] <= 1001  # (the first two started a moment ago)
    # A call made now is planned after the waiting run's start. (Compared as the plan holds
    # them, in server ms: each answer counts from its own moment.)
    store.next_start(keys, "call", 2, 1000)
    plan = keys["plan"]
    assert store.client.zscore(plan, "call") >= store.client.zscore(plan, "run2")


def test_a_run_whose_reserved_start_came_waits_only_for_the_period_to_free_in_its_place(
    store: Store, tag: str
) -> None:
    # Runs start a few ms after their reserved starts (delivery): the run reserved a period
    # after them finds the period full for those ms. It waits for them, not behind every
    # start reserved since (there, a period late and out of call order).
    keys = limit_keys(f"test:{{{tag}}}")
    planned = [store.next_start(keys, f"call{n}", 2, 1000) for n in range(6)]
    assert planned[:2] == [0, 0]
    began = time.monotonic()
    time.sleep(0.4)  # (the first two runs come late)
    assert [store.next_start(keys, f"call{n}", 2, 1000, token="t") for n in (0, 1)] == [0, 0]
    # The next two's reserved starts came; the period of the first two's has not ended.
    time.sleep(max(planned[2], planned[3]) / 1000 + 0.02 - (time.monotonic() - began))
    waits = [store.next_start(keys, f"call{n}", 2, 1000, token="t") for n in (2, 3)]
    assert all(0 < wait < 500 for wait in waits), waits  # (not a period or more)


def test_a_run_that_finds_the_period_full_waits_until_it_is_over_not_its_last_ms(
    store: Store, tag: str
) -> None:
    # Redis's clock is read in whole ms: a start let in at exactly first + period could be
    # less than a period after the first (the chaos run saw 4 starts of a 3/s key in 0.9995 s).
    keys = limit_keys(f"test:{{{tag}}}")
    assert [store.next_start(keys, f"run{n}", 2, 1000, token="t") for n in range(2)] == [0, 0]
    store.next_start(keys, "run2", 2, 1000, token="t")
    first = store.client.zrange(keys["starts"], 0, 0, withscores=True)[0][1]
    planned = store.client.zscore(keys["plan"], "run2")
    assert planned == first + 1000 + 1
