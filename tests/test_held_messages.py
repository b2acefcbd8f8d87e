"""After the dedup Redis lost its data, a worker on RabbitMQ writes back the keys of the
messages it holds and has not started: a message waiting for its countdown, a deferred run
waiting for its next try. Without it, every call made before that message's next try is
accepted (in ``unique_until="started"``, again after every run's start).

The watch's look at the server against a real Redis; then real prefork workers on RabbitMQ,
and a dedup Redis of the test's own, restarted without its data.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

import dedupe
from dedupe.recovery.held import HeldWatch
from dedupe.store.store import Store
from dedupe.values.header import HEADER, KeyHeader
from dedupe.values.keys import CallKeys

from .conftest import RedisFactory
from .helpers import WorkerProcess, app_with_a_store_of_its_own, wait_for

#: The longest a restarted dedup Redis may go without the held message's key.
RESTORED_WITHIN = 3.0


# -- the watch's look at the server --------------------------------------------------------------


class HeldRequest:
    """What the watch reads of a Celery request the worker holds: its id and headers."""

    def __init__(self, task_id: str, keys: CallKeys) -> None:
        self.id = task_id
        self.header_keys = keys
        self.request_dict = {HEADER: KeyHeader(keys, "finished", 60.0).encode(), "task": "t"}


#: A message the worker holds, of a key of its own.
HELD_A = HeldRequest("A", CallKeys.of("held:{t:ab}", separate_run_lock=False))


def watch_holding(url: str, *looks: list[HeldRequest]) -> HeldWatch:
    """A watch whose worker holds ``looks[n]`` at its n-th look at them (nothing after the
    last): the first read of a restore is look 0, and each of its looks after the write
    (one read of the messages started or not, then perhaps one of those not started) the
    next."""
    client = redis.Redis.from_url(url)
    look = [0]

    def held(started: bool = False) -> list[HeldRequest]:
        look[0] += started  # (each look after the write reads the started ones first)
        return looks[look[0]] if look[0] < len(looks) else []

    return HeldWatch(
        Store(client),
        client,
        prefix="held",
        default_ttl=60,
        every=1,
        held=held,
        enable_utc=True,
    )


def test_the_watch_sees_no_loss_at_its_first_look_nor_on_the_same_server(
    redis_factory: RedisFactory,
) -> None:
    watch = watch_holding(redis_factory().url)
    assert watch.lost() is False
    assert watch.lost() is False


def test_the_watch_sees_a_restart_without_the_data_as_a_loss(redis_factory: RedisFactory) -> None:
    server = redis_factory()
    watch = watch_holding(server.url)
    watch.lost()
    server.stop()
    server.start()
    assert watch.lost() is True
    assert watch.lost() is False  # (once)


def test_the_watch_sees_its_marker_gone_as_a_loss_on_the_same_run_of_the_server(
    redis_factory: RedisFactory,
) -> None:
    server = redis_factory()
    watch = watch_holding(server.url)
    watch.lost()
    redis.Redis.from_url(server.url).flushall()
    assert watch.lost() is True


def restored(url: str, *looks: list[HeldRequest]) -> tuple[int, Any]:
    """What a restore wrote back for message A, held at ``looks`` (its
    :func:`watch_holding`): how many took a key, and the key's holder."""
    watch = watch_holding(url, *looks)
    return watch.restore(), Store(redis.Redis.from_url(url)).lookup(HELD_A.header_keys)


def test_a_held_message_takes_its_key_again_as_a_message_that_is_not_running(
    redis_factory: RedisFactory,
) -> None:
    took, holder = restored(redis_factory().url, *[[HELD_A]] * (len(HeldWatch.LOOKS) + 1))
    assert took == 1
    assert holder is not None
    assert (holder.task_id, holder.worker) == ("A", "restored:0")


def test_a_message_received_after_the_first_look_takes_its_key_again(
    redis_factory: RedisFactory,
) -> None:
    # On its way to the worker at the loss (a deferred run's next try published a moment
    # before): held from the second look after the write on.
    took, holder = restored(redis_factory().url, [], [], [HELD_A], [HELD_A])
    assert took == 1
    assert holder is not None
    assert (holder.task_id, holder.worker) == ("A", "restored:0")


def test_a_message_that_ran_while_its_key_was_written_back_has_it_withdrawn(
    redis_factory: RedisFactory,
) -> None:
    # Held when read and at the write; gone at the next look: its run ended in between.
    url = redis_factory().url
    took, _ = restored(url, [HELD_A], [HELD_A])
    assert took == 1
    assert redis.Redis.from_url(url).exists(HELD_A.header_keys.call) == 0


# -- a worker's messages, through a restart --------------------------------------------------------


@pytest.fixture
def producer(
    worker_app: Any, rabbitmq_url: str, tag: str, redis_factory: RedisFactory
) -> Iterator[Celery]:
    """An app on RabbitMQ whose dedup store is a Redis of its own (``app.store_server``)."""
    with app_with_a_store_of_its_own(
        worker_app,
        rabbitmq_url,
        f"held-{tag}",
        redis_factory(),
        broker_transport_options={"confirm_publish": True},
    ) as app:
        try:
            yield app
        finally:
            with app.connection_for_write() as connection:
                connection.default_channel.queue_delete(app.conf.task_default_queue)


@pytest.fixture
def waits_its_turn(worker_app: Any, producer: Celery) -> Any:
    @producer.task(
        name=worker_app.waits_its_turn.name,
        bind=True,
        base=dedupe.DedupeTask,
        unique=True,
        unique_until="started",
        shared=False,
    )
    def waits_its_turn(self: Any, tag: str, seconds: float) -> str: ...

    return waits_its_turn


@pytest.fixture
def worker(producer: Celery, rabbitmq_url: str) -> Iterator[WorkerProcess]:
    store = producer.store_server  # type: ignore[attr-defined]
    env = {
        "DEDUPE_TEST_BROKER": rabbitmq_url,
        "DEDUPE_TEST_QUEUE": producer.conf.task_default_queue,
        "DEDUPE_TEST_STORE": store.url,
    }
    worker = WorkerProcess(producer, env)
    worker.start()
    yield worker
    worker.stop()


def holder_of(task: Any, args: tuple[Any, ...]) -> str | None:
    """The task id that holds the call's key (its queued record first, else its run lock)."""
    holder = dedupe.lookup(task, args)
    return None if holder is None else holder.task_id


def lose_the_dedup_data(producer: Celery) -> None:
    store = producer.store_server  # type: ignore[attr-defined]
    store.stop()
    store.start()


def keeps_its_key_through_a_restart(
    producer: Celery, task: Any, args: tuple[Any, ...], held_id: str, what: str
) -> None:
    """Lose the dedup data: the key must name the held message again within
    RESTORED_WITHIN, and a new call must be its duplicate."""
    lose_the_dedup_data(producer)
    wait_for(
        lambda: holder_of(task, args) == held_id,
        timeout=RESTORED_WITHIN,
        message=f"the key of {what}, written back by the worker that holds it",
    )
    again = task.delay(*args)
    assert again.deduplicated is True
    assert again.id == held_id


def watched_a_restart(producer: Celery, worker: WorkerProcess) -> None:
    """Lose the dedup data, and wait for the worker's look at the messages it holds."""
    looks = worker.tail().count("the dedup Redis lost its data")
    lose_the_dedup_data(producer)
    wait_for(
        lambda: worker.tail().count("the dedup Redis lost its data") > looks,
        timeout=RESTORED_WITHIN,
        message="the worker's look at the messages it holds, after the restart",
    )


@pytest.mark.slow
def test_a_deferred_message_its_worker_holds_keeps_its_key_through_a_dedup_redis_restart(
    worker_app: Any, producer: Celery, waits_its_turn: Any, worker: WorkerProcess, tag: str
) -> None:
    first = waits_its_turn.delay(tag, 2)  # holds the run lock for 2 s
    wait_for(lambda: worker_app.runlog(tag).runs(), message="the first run's start")
    held = waits_its_turn.delay(tag, 2)  # accepted during that run (until="started")
    assert held.deduplicated is False
    wait_for(
        lambda: worker_app._events.llen(f"deferred:{held.id}"),
        message="the second call's message deferred, its next try seconds away",
    )
    keeps_its_key_through_a_restart(
        producer, waits_its_turn, (tag, 2), held.id, "the deferred message"
    )
    assert held.get(timeout=worker_app.WAITS_ITS_TURN + 20) == tag
    assert first.get(timeout=10) == tag
    assert [run[0] for run in worker_app.runlog(tag).runs()] == [first.id, held.id]


@pytest.mark.slow
def test_a_message_waiting_for_its_countdown_keeps_its_key_through_a_dedup_redis_restart(
    worker_app: Any, producer: Celery, waits_its_turn: Any, worker: WorkerProcess, tag: str
) -> None:
    # (The countdown outlasts the restore and the call after it, on a loaded machine too.)
    later = waits_its_turn.apply_async((tag, 0), countdown=10)
    wait_for(lambda: f"[{later.id}] received" in worker.tail(), message="the message received")
    keeps_its_key_through_a_restart(
        producer, waits_its_turn, (tag, 0), later.id, "the message waiting for its countdown"
    )
    assert later.get(timeout=20) == tag


@pytest.mark.slow
def test_a_message_waiting_for_its_rate_limit_keeps_its_key_through_a_dedup_redis_restart(
    worker_app: Any, producer: Celery, worker: WorkerProcess, tag: str
) -> None:
    @producer.task(
        name=worker_app.rate_limited.name,
        bind=True,
        base=dedupe.DedupeTask,
        unique=True,
        shared=False,
    )
    def rate_limited(self: Any, tag: str) -> str: ...

    first = rate_limited.delay(f"{tag}-first")
    wait_for(lambda: worker_app.runlog(f"{tag}-first").runs(), message="the first run")
    held = rate_limited.delay(tag)  # waits in the token bucket for up to 10 s
    wait_for(lambda: f"[{held.id}] received" in worker.tail(), message="the message received")
    keeps_its_key_through_a_restart(
        producer, rate_limited, (tag,), held.id, "the rate-limited message"
    )
    assert held.get(timeout=30) == tag
    assert first.get(timeout=10) == f"{tag}-first"


@pytest.mark.slow
def test_a_revoked_message_is_not_written_back(
    producer: Celery, waits_its_turn: Any, worker: WorkerProcess, tag: str
) -> None:
    later = waits_its_turn.apply_async((tag, 0), countdown=5)
    wait_for(lambda: f"[{later.id}] received" in worker.tail(), message="the message received")
    later.revoke()
    wait_for(lambda: f"flagged as revoked: {later.id}" in worker.tail(), message="the revoke")
    watched_a_restart(producer, worker)
    assert dedupe.lookup(waits_its_turn, (tag, 0)) is None


@pytest.mark.slow
def test_a_message_that_ran_is_not_written_back_after_a_later_restart(
    producer: Celery, waits_its_turn: Any, worker: WorkerProcess, tag: str
) -> None:
    later = waits_its_turn.apply_async((tag, 0), countdown=1)
    assert later.get(timeout=20) == tag
    watched_a_restart(producer, worker)
    assert dedupe.lookup(waits_its_turn, (tag, 0)) is None
