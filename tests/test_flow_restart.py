"""key_concurrency across a restart of the dedup Redis: every slot is lost with its data,
and the runs that held them go on; new starts wait until the live runs are counted again
(settle.lua), so never more than N run at once. A real prefork worker; its dedup Redis a
private server the test restarts (the broker is the session's Redis)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from .conftest import RedisFactory
from .helpers import WorkerProcess, app_with_a_store_of_its_own, limited_stub, wait_for
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
        one_at_once = limited_stub(producer, worker_app)
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
            copy_dropped(worker, second.id, LEASE)  # (it waited through the settling)
        finally:
            client.close()
            worker.stop()
    assert most_at_once(worker_app.runlog(tag).runs()) == 1


#: The lease of the backstop tests: a waiting call's copy in the broker is due this long on.
BACKSTOP_LEASE = 3.0


def copy_dropped(worker: WorkerProcess, task_id: str, lease: float = BACKSTOP_LEASE) -> None:
    """The copy in the broker of a call that waited, due a lease after it was sent, came and
    was dropped: the call ran already (and the mark that said so is gone)."""
    wait_for(
        lambda: f"{task_id}] is dropped: a copy" in worker.tail(),
        timeout=3 * lease,
        message=f"the copy of {task_id} came and was dropped",
    )


def backstop_env(queue: str, store: Any) -> dict[str, str]:
    return {
        "DEDUPE_TEST_QUEUE": queue,
        "DEDUPE_TEST_STORE": store.url,
        "DEDUPE_TEST_LEASE": str(BACKSTOP_LEASE),
    }


@contextmanager
def backstopped(
    redis_factory: RedisFactory, worker_app: Any, tag: str
) -> Iterator[tuple[Any, Any, WorkerProcess]]:
    """A dedup Redis of the test's own apart from the broker (the session's Redis), the
    producer's one_at_once and a prefork worker for it: (store server, task, worker)."""
    store = redis_factory()
    queue = f"backstop-{tag}"
    with app_with_a_store_of_its_own(
        worker_app, worker_app.BROKER, queue, store, dedupe_default_lease=BACKSTOP_LEASE
    ) as producer:
        worker = WorkerProcess(producer, backstop_env(queue, store))
        worker.start()
        try:
            yield store, limited_stub(producer, worker_app), worker
        finally:
            worker.stop()


def test_a_waiting_call_outlives_a_loss_of_the_dedup_data_on_a_broker_apart_from_it(
    redis_factory: RedisFactory, worker_app: Any, tag: str
) -> None:
    # The call waits held in the dedup Redis, and its copy waits in the broker: the restart
    # loses the first, and the second comes back and takes a place again.
    with backstopped(redis_factory, worker_app, tag) as (store, one_at_once, worker):
        first = one_at_once.delay(tag, 0, 4.0)
        wait_for(lambda: worker_app.runlog(tag).runs(), message="the first run started")
        second = one_at_once.delay(tag, 1, 0.0)
        wait_for(
            lambda: f"{second.id}] waits its turn" in worker.tail(),
            message="the second call waits in line",
        )
        store.stop()
        store.start()  # (the line and what it held are lost)
        assert first.get(timeout=30) == 0
        assert second.get(timeout=30) == 1
        copy_dropped(worker, second.id)
    assert most_at_once(worker_app.runlog(tag).runs()) == 1


def test_the_copy_in_the_broker_of_a_call_that_ran_is_dropped(
    redis_factory: RedisFactory, worker_app: Any, tag: str
) -> None:
    # Handed on as the first run ends, the second call runs; its copy comes a lease later.
    with backstopped(redis_factory, worker_app, tag) as (_, one_at_once, worker):
        first = one_at_once.delay(tag, 0, 1.0)
        second = one_at_once.delay(tag, 1, 0.0)
        assert (first.get(timeout=30), second.get(timeout=30)) == (0, 1)
        copy_dropped(worker, second.id)
    runs = worker_app.runlog(tag).runs()
    assert sorted(run[0] for run in runs) == sorted([first.id, second.id])
