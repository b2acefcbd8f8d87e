"""A message revoked while it waits in a worker frees its key at once (issue 40).

A real prefork worker with one child runs a long run of another key; the revoked message waits
behind it in the worker's reserved requests (prefetched). Celery adds the id to the worker's
revoked set then, and sends ``task_revoked`` only when the worker reaches the message: the key
must not wait that long. The revoke is sent from the test process, as another process would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery

import dedupe

from .helpers import WorkerProcess, producer_stub, wait_for

pytestmark = pytest.mark.slow

#: Seconds within which a revoked message's key must be free: far less than the run it
#: waits behind (a broadcast reaches a busy machine's worker in a few seconds at worst).
AT_ONCE = 6.0
#: Seconds of the run the revoked message waits behind.
LONG_RUN = 15.0


@pytest.fixture
def one_child(
    make_app: Callable[..., Celery], broker: str, worker_app: Any
) -> Iterator[tuple[Any, WorkerProcess]]:
    """``tests.worker_app.ok`` declared on a producer of this test's own queue and keys, and a
    prefork worker with one child that reads that queue (one message prefetched)."""
    producer = make_app(broker=broker, dedupe_redis_url=worker_app.STORE)
    env = {
        "DEDUPE_TEST_BROKER": broker,
        "DEDUPE_TEST_QUEUE": producer.conf.task_default_queue,
        "DEDUPE_TEST_PREFIX": producer.conf.dedupe_key_prefix,
    }
    worker = WorkerProcess(producer, env, concurrency=1)  # (pinged through its own broker)
    worker.start()
    try:
        yield producer_stub(producer, worker_app.ok), worker
    finally:
        worker.stop()


def waiting_behind_a_long_run(
    ok: Any, worker: WorkerProcess, worker_app: Any, tag: str, seconds: float
) -> Any:
    """Start a run of ``seconds`` on the worker's one child, then call ``ok(tag)``: its
    message waits in the worker, received, behind that run."""
    ok.delay(f"{tag}-long", seconds)
    wait_for(lambda: worker_app.runlog(f"{tag}-long").runs(), message="the long run started")
    waiting = ok.delay(tag)
    assert waiting.deduplicated is False
    wait_for(lambda: f"[{waiting.id}] received" in worker.tail(), message="the message received")
    return waiting


def test_a_message_revoked_while_it_waits_behind_a_run_frees_its_key_at_once(
    one_child: tuple[Any, WorkerProcess], worker_app: Any, tag: str
) -> None:
    ok, worker = one_child
    first = waiting_behind_a_long_run(ok, worker, worker_app, tag, LONG_RUN)

    revoked_at = time.monotonic()
    ok.app.control.revoke(first.id)
    wait_for(
        lambda: dedupe.lookup(ok, (tag,)) is None,
        timeout=AT_ONCE,
        message=f"the key of the revoked {first.id} freed",
    )
    freed_in = time.monotonic() - revoked_at
    again = ok.delay(tag)

    assert again.deduplicated is False
    assert again.id != first.id
    assert freed_in <= AT_ONCE
    [(_, _, ended)] = worker_app.runlog(f"{tag}-long").runs()
    assert ended is None  # (the message still waits: only the revoke freed its key)
    line = f"{ok.name}[{first.id}] was dropped unrun (revoked): its key"
    wait_for(lambda: line in worker.tail(), message="the worker's line")


def test_a_revoked_message_leaves_a_newer_call_holding_its_key_and_says_nothing(
    one_child: tuple[Any, WorkerProcess], worker_app: Any, side_queue: str, tag: str
) -> None:
    ok, worker = one_child
    first = waiting_behind_a_long_run(ok, worker, worker_app, tag, 5.0)
    # The first record goes (cleared by hand); a newer call, sent where no worker reads,
    # holds the key from the revoke until the worker has met the revoked message.
    assert dedupe.clear(ok, (tag,)) is True
    newer = ok.apply_async((tag,), queue=side_queue)
    assert newer.deduplicated is False

    ok.app.control.revoke(first.id)
    # The worker takes the next message only once it has met (and dropped) the revoked one.
    after = ok.delay(f"{tag}-after")
    assert after.get(timeout=LONG_RUN + 15) == f"{tag}-after"

    assert f"Discarding revoked task: {ok.name}[{first.id}]" in worker.tail()
    holder = dedupe.lookup(ok, (tag,))
    assert holder is not None
    assert (holder.task_id, holder.state) == (newer.id, "queued")
    lines = [line for line in worker.tail().splitlines() if f"[{first.id}]" in line]
    assert not [line for line in lines if "freed" in line]


def test_a_message_revoked_while_it_waits_for_its_eta_frees_its_key_at_once(
    one_child: tuple[Any, WorkerProcess], worker_app: Any, tag: str
) -> None:
    # A countdown's message waits in the worker's timer, not among its reserved requests;
    # Celery drops it only when its eta comes (ten minutes here).
    ok, worker = one_child
    first = ok.apply_async((tag,), countdown=600)
    assert first.deduplicated is False
    wait_for(lambda: f"[{first.id}] received" in worker.tail(), message="the message received")

    ok.app.control.revoke(first.id)
    wait_for(
        lambda: dedupe.lookup(ok, (tag,)) is None,
        timeout=AT_ONCE,
        message=f"the key of the revoked {first.id} freed",
    )
    again = ok.delay(tag)
    assert again.deduplicated is False
    assert again.get(timeout=10) == tag
