"""A call interrupted while Redis decides it (Celery's soft time limit, raised by a signal
handler wherever the task is) leaves no record without its message: whatever its first write
did is withdrawn before the exception leaves the call (a limited call's place in line too).
Real prefork worker, real Redis; a proxy holds Redis's answer until the limit has fired."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

import dedupe
from dedupe.producer.guard import keys_of_call
from dedupe.values.keys import CallKeys
from dedupe.values.limits import limit_keys

from .conftest import RedisFactory
from .helpers import (
    WorkerProcess,
    app_with_a_store_of_its_own,
    limited_stub,
    producer_stub,
    wait_for,
)
from .proxies import HoldingProxy

pytestmark = pytest.mark.slow


@pytest.fixture
def interrupted_worker(
    redis_factory: RedisFactory, worker_app: Any, tag: str
) -> Iterator[tuple[Any, Any, HoldingProxy]]:
    """A producer app, its stub of ``ok``, and the proxy between a prefork worker (one child)
    and its dedup Redis (a server of the test's own: the call is reserved, published,
    confirmed)."""
    store = redis_factory()
    # Held past the soft limit, within the client's socket timeout (2 s).
    proxy = HoldingProxy(store.port, hold_for=worker_app.INTERRUPTING_LIMIT + 0.8)
    queue = f"interrupted-{tag}"
    with app_with_a_store_of_its_own(worker_app, worker_app.BROKER, queue, store) as producer:
        env = {"DEDUPE_TEST_QUEUE": queue, "DEDUPE_TEST_STORE": proxy.url}
        worker = WorkerProcess(producer, env, concurrency=1)
        worker.start()
        try:
            yield producer, producer_stub(producer, worker_app.ok), proxy
        finally:
            worker.stop()
            proxy.close()


def _hold_the_answer_to(proxy: HoldingProxy, task: Any, args: tuple[Any, ...]) -> CallKeys:
    """Have ``proxy`` hold Redis's answer to the next command naming the key of ``task(*args)``
    (that call's keys)."""
    _, keys = keys_of_call(task, args, None, None, {})
    proxy.hold_at = (keys.call.encode(),)
    return keys


def _interrupted(
    producer: Any, ok: Any, proxy: HoldingProxy, worker_app: Any, tag: str, before: str, **more: Any
) -> None:
    """Run ``accepted_when_its_limit_fires`` with Redis's answer to its call held."""
    _hold_the_answer_to(proxy, ok, (f"{tag}-new",))
    name = worker_app.accepted_when_its_limit_fires.name
    outcome = producer.send_task(name, (tag, before), more)
    assert outcome.get(timeout=15) == "interrupted"
    assert proxy.held == 1


@pytest.mark.parametrize(
    "before",
    ["duplicates", "busy", "first"],
    ids=["decided first", "read at the push", "the process's first enqueue, read at once"],
)
def test_a_call_its_soft_time_limit_interrupts_leaves_its_key_free(
    interrupted_worker: tuple[Any, Any, HoldingProxy], worker_app: Any, tag: str, before: str
) -> None:
    producer, ok, proxy = interrupted_worker
    if before == "first":
        # The server knows the script (a call of this process's): no NOSCRIPT for the worker.
        ok.delay(f"{tag}-held")
    _interrupted(producer, ok, proxy, worker_app, tag, before)
    # Its message was never published: neither may its record be left, answering every call
    # of the key with a task id that never runs until the provisional ttl frees it.
    assert dedupe.lookup(ok, (f"{tag}-new",)) is None
    again = ok.delay(f"{tag}-new")
    assert again.deduplicated is False
    assert again.get(timeout=10) == f"{tag}-new"
    # (The held call runs after it: its key is freed before the worker stops.)
    wait_for(lambda: dedupe.lookup(ok, (f"{tag}-held",)) is None, message="the held call ran")


def test_an_interrupted_call_leaves_an_earlier_calls_record_of_its_task_id_alone(
    interrupted_worker: tuple[Any, Any, HoldingProxy], worker_app: Any, tag: str
) -> None:
    # Deterministic task ids are a dedup idiom: the interrupted call's enqueue met the key
    # held by the earlier call of the same id, whose message is queued.
    producer, ok, proxy = interrupted_worker
    first = ok.apply_async((f"{tag}-new",), task_id=f"{tag}-id", countdown=3)
    _interrupted(producer, ok, proxy, worker_app, tag, "busy", task_id=f"{tag}-id")
    holder = dedupe.lookup(ok, (f"{tag}-new",))
    assert holder is not None
    assert (holder.task_id, holder.state) == (first.id, "queued")
    assert first.get(timeout=15) == f"{tag}-new"
    wait_for(lambda: dedupe.lookup(ok, (f"{tag}-held",)) is None, message="the held call ran")


def test_a_limited_call_interrupted_at_its_place_in_line_leaves_the_line(
    interrupted_worker: tuple[Any, Any, HoldingProxy], worker_app: Any, tag: str
) -> None:
    # Its message was never published: a place left for it would name a call that never runs
    # (holding the calls behind it for a lease, and in the line for unique_ttl).
    producer, _, proxy = interrupted_worker
    limited = limited_stub(producer, worker_app)
    # The server knows the line's script (a call of this process's): no NOSCRIPT for the
    # worker, whose place is taken as its command arrives.
    assert limited.delay(f"{tag}-first", 0, 0.1).get(timeout=15) == 0
    keys = _hold_the_answer_to(proxy, limited, (tag, 0, 0.1))
    name = worker_app.limited_call_when_its_limit_fires.name
    assert producer.send_task(name, (tag,)).get(timeout=15) == "interrupted"
    assert proxy.held == 1
    line = limit_keys(keys.call)["line"]
    assert redis.Redis.from_url(proxy.url).zscore(line, f"{tag}-interrupted") is None


def test_a_run_whose_claim_its_soft_time_limit_interrupts_leaves_its_key_free(
    interrupted_worker: tuple[Any, Any, HoldingProxy], worker_app: Any, tag: str
) -> None:
    # The claim landed (Redis ran it at once), its answer never read: the key stays held
    # while the run goes on (no second run may start beside it), and is freed at its end,
    # not a lease (30 s here) later.
    producer, ok, proxy = interrupted_worker
    # The server knows the claim's script (a run of the worker's): no NOSCRIPT for the claim,
    # which runs as it arrives.
    assert ok.delay(f"{tag}-first").get(timeout=10) == f"{tag}-first"
    task = producer_stub(producer, worker_app.claimed_when_its_limit_fires)
    _hold_the_answer_to(proxy, task, (tag,))
    result = task.delay(tag)
    wait_for(lambda: worker_app.runlog(tag).runs(), message="the run started")
    holder = dedupe.lookup(task, (tag,))
    assert holder is not None
    assert holder.task_id == result.id
    assert result.get(timeout=15) == tag
    assert proxy.held == 1
    wait_for(lambda: dedupe.lookup(task, (tag,)) is None, timeout=5, message="the key freed")
