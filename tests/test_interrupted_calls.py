"""A call interrupted while Redis decides it (Celery's soft time limit, raised by a signal
handler wherever the task is) leaves no record without its message: whatever its first write
did is withdrawn before the exception leaves the call. Real prefork worker, real Redis; a
proxy holds Redis's answer until the limit has fired."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import dedupe
from dedupe.producer.guard import keys_of_call

from .conftest import RedisFactory
from .helpers import WorkerProcess, app_with_a_store_of_its_own, producer_stub, wait_for
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


@pytest.mark.parametrize("duplicates", [0, 8], ids=["pipelined", "decided-first"])
def test_a_call_its_soft_time_limit_interrupts_leaves_its_key_free(
    interrupted_worker: tuple[Any, Any, HoldingProxy], worker_app: Any, tag: str, duplicates: int
) -> None:
    producer, ok, proxy = interrupted_worker
    _, keys = keys_of_call(ok, (f"{tag}-new",), None, None, {})
    proxy.hold_at = (keys.call.encode(),)
    outcome = producer.send_task(worker_app.accepted_when_its_limit_fires.name, (tag, duplicates))
    assert outcome.get(timeout=15) == "interrupted"
    assert proxy.held == 1
    # Its message was never published: neither may its record be left, answering every call
    # of the key with a task id that never runs until the provisional ttl frees it.
    assert dedupe.lookup(ok, (f"{tag}-new",)) is None
    again = ok.delay(f"{tag}-new")
    assert again.deduplicated is False
    assert again.get(timeout=10) == f"{tag}-new"
    # (The held call runs after it: its key is freed before the worker stops.)
    wait_for(lambda: dedupe.lookup(ok, (f"{tag}-held",)) is None, message="the held call ran")
