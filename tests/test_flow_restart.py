"""key_concurrency across a restart of the dedup Redis: every slot is lost with its data,
and the runs that held them go on; new starts wait until the live runs are counted again
(settle.lua), so never more than N run at once. A real prefork worker; its dedup Redis a
private server the test restarts (the broker is the session's Redis)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

import dedupe

from .conftest import RedisFactory
from .helpers import WorkerProcess, app_with_a_store_of_its_own, wait_for
from .test_key_concurrency import most_at_once

pytestmark = pytest.mark.slow

#: The lease of the test's slots: a heartbeat every 4 s, later than the call after the
#: restart; the lines settle this long.
LEASE = 12.0


def test_no_call_starts_beside_a_live_run_whose_slot_a_restart_lost(
    redis_factory: RedisFactory, worker_app: Any, tag: str
) -> None:
    store = redis_factory()
    queue = f"settle-{tag}"
    with app_with_a_store_of_its_own(
        worker_app, worker_app.BROKER, queue, store, dedupe_default_lease=LEASE
    ) as producer:

        @producer.task(
            name=worker_app.one_at_once.name,
            bind=True,
            base=dedupe.DedupeTask,
            unique_on=("tag",),
            key_concurrency=1,
            shared=False,
        )
        def one_at_once(self: Any, tag: str, index: int, seconds: float) -> int: ...

        env = {
            "DEDUPE_TEST_QUEUE": queue,
            "DEDUPE_TEST_STORE": store.url,
            "DEDUPE_TEST_LEASE": str(LEASE),
        }
        worker = WorkerProcess(producer, env)
        worker.start()
        client = redis.Redis.from_url(store.url)
        try:
            first = one_at_once.delay(tag, 0, 6.0)
            wait_for(lambda: worker_app.runlog(tag).runs(), message="the first run started")
            store.stop()
            store.start()  # (every slot and line lost; the first run goes on)
            wait_for(
                lambda: client.exists(f"{worker_app.PREFIX}:lines:hold"),
                message="the worker saw the restart",
            )
            second = one_at_once.delay(tag, 1, 0.0)
            assert second.get(timeout=60) == 1
            assert first.get(timeout=10) == 0
        finally:
            client.close()
            worker.stop()
    assert most_at_once(worker_app.runlog(tag).runs()) == 1
