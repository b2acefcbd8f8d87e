"""Every event of a key is a signal carrying task name, task id, key and holder, and a log
line in its family (dedupe.events)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.utils.dispatch import Signal

import dedupe
from dedupe import events
from dedupe.demo.server import RedisServer
from dedupe.runs.heartbeat import Heartbeat
from dedupe.store.commands.leases import Lease
from dedupe.store.store import Store
from dedupe.values.keys import CallKeys
from dedupe.values.record import pack_running

from .conftest import RedisFactory, in_process_worker
from .helpers import wait_for

Received = list[dict[str, Any]]


@pytest.fixture
def received() -> Iterator[Callable[[Signal], Received]]:
    """Call with a signal: the list its sends are appended to, for this test."""
    connected: list[tuple[Signal, Callable[..., None]]] = []

    def listen(signal: Signal) -> Received:
        sends: Received = []

        def receiver(sender: Any = None, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            sends.append({"sender": sender, **kwargs})

        signal.connect(receiver, weak=False)
        connected.append((signal, receiver))
        return sends

    yield listen
    for signal, receiver in connected:
        signal.disconnect(receiver)


@pytest.fixture
def job(app: Celery) -> Any:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def sync_customer(customer_id: int) -> int:
        return customer_id

    return sync_customer


def test_an_accepted_call_sends_call_accepted_with_its_task_id_and_key(
    job: Any, received: Callable[[Signal], Received]
) -> None:
    sends = received(events.call_accepted)
    result = job.delay(1)
    assert sends == [
        {
            "sender": job.name,
            "task_name": job.name,
            "task_id": result.id,
            "key": result.keys.call,
            "holder": None,
            "path": sends[0]["path"],
        }
    ]
    assert sends[0]["path"] in ("one-step", "overlap", "decide", "confirm")


def test_a_duplicate_call_sends_call_deduplicated_naming_the_holder(
    job: Any, received: Callable[[Signal], Received]
) -> None:
    first = job.delay(1)
    sends = received(events.call_deduplicated)
    again = job.delay(1)
    assert len(sends) == 1
    assert sends[0]["task_name"] == job.name
    assert sends[0]["key"] == first.keys.call
    assert sends[0]["holder"] == again.holder
    assert sends[0]["holder"].task_id == first.id


def test_a_duplicate_call_logs_at_info_in_the_calls_family(
    job: Any, caplog: pytest.LogCaptureFixture
) -> None:
    first = job.delay(1)
    with caplog.at_level(logging.INFO, logger="dedupe.calls"):
        job.delay(1)
    (line,) = [record for record in caplog.records if record.name == "dedupe.calls"]
    assert line.levelno == logging.INFO
    assert f"duplicate of {first.id} (queued)" in line.getMessage()


def test_a_receiver_that_raises_never_fails_the_call(
    job: Any, received: Callable[[Signal], Received]
) -> None:
    def broken(**_: Any) -> None:
        raise RuntimeError("a broken metrics receiver")

    events.call_accepted.connect(broken, weak=False)
    try:
        assert job.delay(1).deduplicated is False
    finally:
        events.call_accepted.disconnect(broken)


@pytest.mark.slow
def test_a_run_sends_run_claimed_then_key_released(
    app: Celery, job: Any, received: Callable[[Signal], Received]
) -> None:
    claimed = received(events.run_claimed)
    released = received(events.key_released)
    with in_process_worker(app):
        result = job.delay(7)
        assert result.get(timeout=10) == 7
        wait_for(lambda: released, message="key_released")
    assert [(send["task_id"], send["key"]) for send in claimed] == [(result.id, result.keys.run)]
    assert [(send["task_id"], send["key"]) for send in released] == [(result.id, result.keys.run)]


@pytest.mark.slow
def test_a_bypassing_message_that_finds_the_key_held_sends_run_skipped(
    app: Celery, received: Callable[[Signal], Received], side_queue: str
) -> None:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, on_running="skip")
    def refresh(x: int) -> None: ...

    holder = refresh.delay(1)  # queued, never run here: the key stays held
    skipped = received(events.run_skipped)
    with in_process_worker(app, queues=[side_queue]):
        bypass = app.send_task(refresh.name, args=(1,), queue=side_queue)
        wait_for(lambda: skipped, message="run_skipped")
    assert skipped[0]["task_id"] == bypass.id
    assert skipped[0]["holder"].task_id == holder.id


@pytest.mark.slow
def test_a_bypassing_message_of_a_retrying_task_sends_run_deferred_with_its_countdown(
    app: Celery, received: Callable[[Signal], Received], side_queue: str
) -> None:
    @app.task(
        shared=False,
        base=dedupe.DedupeTask,
        unique=True,
        on_running="retry",
        on_running_countdown=30,
    )
    def refresh(x: int) -> None: ...

    holder = refresh.delay(1)
    deferred = received(events.run_deferred)
    with in_process_worker(app, queues=[side_queue]):
        bypass = app.send_task(refresh.name, args=(1,), queue=side_queue)
        wait_for(lambda: deferred, message="run_deferred")
    assert deferred[0]["task_id"] == bypass.id
    assert deferred[0]["holder"].task_id == holder.id
    assert deferred[0]["countdown"] == 30


def test_a_call_while_redis_is_down_sends_redis_unavailable_with_what_happened(
    make_app: Callable[..., Celery],
    redis_factory: RedisFactory,
    received: Callable[[Signal], Received],
) -> None:
    server = redis_factory()
    app = make_app(dedupe_redis_url=server.url, dedupe_on_redis_error="enqueue")

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    server.stop()
    sends = received(events.redis_unavailable)
    result = job.delay(1)
    # (A later step may report its own failure too: the confirm of a record whose write's
    # fate was unknown.)
    assert (sends[0]["task_id"], sends[0]["action"]) == (result.id, "is published without dedup")
    assert isinstance(sends[0]["error"], redis.ConnectionError)


# -- the heartbeat's events ----------------------------------------------------------------


@pytest.fixture
def store(redis_factory: RedisFactory) -> Store:
    server: RedisServer = redis_factory()
    return Store(redis.Redis.from_url(server.url))


def _held(store: Store, key: str) -> Lease:
    keys = CallKeys(key, key)
    assert store.claim(keys, "task-1", "run-1", 600, "host", 1, time.time()) is None
    return Lease(key, "task-1", "run-1", 600, pack_running("task-1", "run-1", "host", 1, 0))


def test_a_heartbeat_that_finds_another_run_holding_its_key_sends_lease_lost(
    store: Store, received: Callable[[Signal], Received]
) -> None:
    lost = received(events.lease_lost)
    heartbeat = Heartbeat(store)
    lease = _held(store, "k:{lost}")
    heartbeat.hold(lease, "jobs.sync")
    store.client.set("k:{lost}", pack_running("task-2", "run-2", "host", 2, 0))
    wait_for(lambda: lost, timeout=3, message="lease_lost")
    assert lost[0]["task_name"] == "jobs.sync"
    assert (lost[0]["task_id"], lost[0]["key"]) == ("task-1", "k:{lost}")


def test_a_heartbeat_that_finds_its_key_gone_sends_key_recreated(
    store: Store, received: Callable[[Signal], Received]
) -> None:
    recreated = received(events.key_recreated)
    heartbeat = Heartbeat(store)
    lease = _held(store, "k:{gone}")
    heartbeat.hold(lease, "jobs.sync")
    store.client.delete("k:{gone}")
    wait_for(lambda: recreated, timeout=3, message="key_recreated")
    assert (recreated[0]["task_id"], recreated[0]["key"]) == ("task-1", "k:{gone}")
    heartbeat.drop(lease)


def test_every_event_has_a_signal_a_family_logger_and_a_line_that_formats() -> None:
    assert set(events.EVENTS) == {
        "call_accepted",
        "call_deduplicated",
        "run_claimed",
        "run_deferred",
        "run_skipped",
        "key_released",
        "key_reclaimed",
        "lease_lost",
        "key_recreated",
        "key_restored",
        "redis_unavailable",
    }
    fields = {
        "task_name": "t",
        "task_id": "i",
        "key": "k",
        "holder_id": "h",
        "holder_state": "queued",
        "what": "freed",
        "path": "one-step",
        "countdown": 2.0,
        "deferral": 1,
        "action": "ran unguarded",
        "error": "down",
        "reason": "h is running",
    }
    for name, event in events.EVENTS.items():
        assert getattr(events, name) is event.signal
        assert event.logger.name in {"dedupe.calls", "dedupe.runs", "dedupe.keys", "dedupe.redis"}
        assert event.message % fields
