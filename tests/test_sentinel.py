"""The dedup store on a Sentinel-managed master: a real set (a master, a replica, three
sentinels) started by the test, and a failover during calls and during a run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery

import dedupe
from dedupe.demo.server import find_redis_server

from .conftest import in_process_worker
from .helpers import require, wait_for
from .servers import SentinelSet

pytestmark = pytest.mark.slow

MASTER = SentinelSet.master_name


def _sentinel_set() -> Iterator[SentinelSet]:
    require(find_redis_server() is not None, "no redis-server to start a Sentinel set with")
    with SentinelSet() as found:
        yield found


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    """A set of a test's own: the failover tests change its master."""
    yield from _sentinel_set()


@pytest.fixture(scope="module")
def steady_sentinels() -> Iterator[SentinelSet]:
    """A set the tests without a failover share (starting one takes seconds)."""
    yield from _sentinel_set()


@pytest.fixture
def sentinel_app(make_app: Callable[..., Celery], sentinels: SentinelSet) -> Celery:
    return make_app(dedupe_redis_url=sentinels.url, dedupe_redis_options={"master_name": MASTER})


@pytest.fixture
def steady_app(make_app: Callable[..., Celery], steady_sentinels: SentinelSet) -> Celery:
    url = steady_sentinels.url
    return make_app(dedupe_redis_url=url, dedupe_redis_options={"master_name": MASTER})


def test_calls_deduplicate_on_the_master_the_sentinels_name(
    steady_app: Celery, steady_sentinels: SentinelSet
) -> None:
    @steady_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    first = job.delay(1)
    assert job.delay(1).deduplicated
    record = steady_sentinels.client(steady_sentinels.master_port()).get(first.keys.call)
    assert record is not None


def test_asyncio_calls_deduplicate_on_the_master_the_sentinels_name(
    steady_app: Celery, steady_sentinels: SentinelSet
) -> None:
    @steady_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    async def twice() -> list[dedupe.DedupeResult]:
        return [await job.aapply_async_unique((2,)), await job.aapply_async_unique((2,))]

    first, second = asyncio.run(twice())
    assert (first.deduplicated, second.deduplicated) == (False, True)
    assert steady_sentinels.client(steady_sentinels.master_port()).exists(first.keys.call)


def test_a_url_without_the_master_name_says_how_to_give_it(
    make_app: Callable[..., Celery], steady_sentinels: SentinelSet
) -> None:
    app = make_app(dedupe_redis_url=steady_sentinels.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    with pytest.raises(dedupe.ConfigurationError, match="master_name"):
        job.delay(1)


def test_a_sentinel_broker_gives_the_store_its_master(
    make_app: Callable[..., Celery], steady_sentinels: SentinelSet
) -> None:
    app = make_app(
        broker=steady_sentinels.url,
        broker_transport_options={"master_name": MASTER},
        dedupe_redis_url=None,
    )
    config = dedupe.runs.runtime.runtime_of(app).config
    assert config.redis_url == steady_sentinels.url
    assert config.redis_options["master_name"] == MASTER


def test_calls_go_on_through_a_failover_and_keep_their_keys(
    sentinel_app: Celery, sentinels: SentinelSet
) -> None:
    @sentinel_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    before = [job.delay(x) for x in range(20)]
    wait_for(
        lambda: sentinels.client(sentinels.ports["b"]).dbsize() >= 20,
        message="the replica has the keys",
    )
    errors: list[BaseException] = []
    stop = threading.Event()

    def burst() -> None:
        x = 100
        while not stop.is_set():
            try:
                job.delay(x % 40 + 100)
            except BaseException as exc:  # the policy ("enqueue") must absorb the failover
                errors.append(exc)
            x += 1

    caller = threading.Thread(target=burst)
    caller.start()
    try:
        new_master = sentinels.failover()
        time.sleep(1.0)  # calls on the new master
    finally:
        stop.set()
        caller.join(30)
    assert errors == []
    assert new_master == sentinels.ports["b"]
    # Keys written before the failover were replicated: their calls are still duplicates.
    again = [job.delay(x) for x in range(20)]
    assert all(result.deduplicated for result in again)
    assert [r.id for r in again] == [r.id for r in before]
    assert not job.delay(999).deduplicated  # and new keys are written on the new master
    assert sentinels.client(new_master).exists(job.delay(999).keys.call)


def test_a_runs_key_follows_the_run_through_a_failover_and_is_freed_at_its_end(
    sentinel_app: Celery, sentinels: SentinelSet
) -> None:
    sentinel_app.conf.dedupe_default_lease = 3
    gate = threading.Event()

    @sentinel_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None:
        gate.wait(30)

    with in_process_worker(sentinel_app):
        result = job.delay(1)
        wait_for(
            lambda: (h := dedupe.lookup(job, (1,))) is not None and h.state == "running",
            message="running",
        )
        new_master = sentinels.failover()
        time.sleep(3.5)  # past one lease: only renewals on the new master keep the key
        holder: Any = dedupe.lookup(job, (1,))
        assert holder is not None
        assert holder.state == "running"
        assert sentinels.client(new_master).exists(result.keys.call)
        gate.set()
        result.get(timeout=10)
        wait_for(lambda: dedupe.lookup(job, (1,)) is None, timeout=5, message="freed")
