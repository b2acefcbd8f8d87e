"""A message the worker drops without running it frees its key at once (issue 40).

Each test publishes a unique call through the producer (its record queued, its key in the
message's header), lets a real worker drop the message, and expects the same call accepted
again within 2 s, not answered with a task id that never runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery, signals
from kombu.serialization import registry

import dedupe

from .conftest import RedisFactory, in_process_worker, unique_name
from .helpers import Lines, WorkerProcess, wait_for

pytestmark = pytest.mark.slow

#: Seconds within which a dropped message's key must be free.
AT_ONCE = 2.0

#: A serializer whose bodies no decoder reads (its content type the worker accepts).
GARBLED = "dedupe-test-garbled"
GARBLED_TYPE = "application/x-dedupe-test-garbled"


@pytest.fixture
def garbled() -> Iterator[str]:
    """A serializer whose every body fails to decode."""

    def refuse(data: Any) -> Any:
        raise ValueError("not a body anyone can read")

    registry.register(GARBLED, lambda obj: "garbled", refuse, GARBLED_TYPE)
    yield GARBLED
    registry.unregister(GARBLED)


def unique_task(app: Celery, name: str, **options: Any) -> Any:
    """A unique DedupeTask named ``name`` on ``app``, which returns its argument."""

    @app.task(name=name, shared=False, base=dedupe.DedupeTask, unique=True, **options)
    def echo(x: int) -> int:
        return x

    return echo


def same_queue_and_keys(make_app: Callable[..., Celery], app: Celery) -> Celery:
    """Another app on ``app``'s broker, queue, dedup Redis and key prefix (a worker of it)."""
    return make_app(
        broker=app.conf.broker_url,
        task_default_queue=app.conf.task_default_queue,
        dedupe_key_prefix=app.conf.dedupe_key_prefix,
    )


def freed_at_once(task: Any, worker_app: Celery, why: str, **options: Any) -> None:
    """Publish ``task(7)`` with ``options``; a worker of ``worker_app`` drops it: the same
    call is accepted again within :data:`AT_ONCE`, and one line says why the key went."""
    first = task.apply_async((7,), **options)
    assert first.deduplicated is False
    holder = dedupe.lookup(task, (7,))
    assert holder is not None
    assert (holder.task_id, holder.state) == (first.id, "queued")

    with Lines("dedupe.keys") as lines, in_process_worker(worker_app):
        wait_for(
            lambda: dedupe.lookup(task, (7,)) is None,
            timeout=AT_ONCE,
            message=f"the key of the dropped {first.id} freed",
        )
        again = task.apply_async((7,), **options)

    assert again.deduplicated is False
    assert again.id != first.id
    assert f"{task.name}[{first.id}] was dropped unrun ({why}): its key" in lines.text


def test_a_task_the_worker_does_not_know_frees_its_key(
    make_app: Callable[..., Celery], app: Celery
) -> None:
    task = unique_task(app, unique_name("unknown"))
    worker_app = same_queue_and_keys(make_app, app)  # (it never registers the task)
    freed_at_once(task, worker_app, "unregistered task")


def test_content_the_worker_does_not_accept_frees_its_key(app: Celery) -> None:
    task = unique_task(app, unique_name("pickled"), serializer="pickle")  # (accepted: json)
    freed_at_once(task, app, "content not accepted")


def test_a_body_the_worker_cannot_decode_frees_its_key(
    make_app: Callable[..., Celery], broker: str, garbled: str
) -> None:
    app = make_app(broker=broker, accept_content=["json", GARBLED_TYPE])
    task = unique_task(app, unique_name("garbled"), serializer=garbled)
    freed_at_once(task, app, "undecodable body")


def test_an_eta_celery_cannot_read_frees_its_key(app: Celery) -> None:
    task = unique_task(app, unique_name("badeta"))
    freed_at_once(task, app, "invalid eta", eta="not a date")


def test_a_dedup_redis_down_while_freeing_is_logged_and_the_worker_goes_on(
    make_app: Callable[..., Celery], broker: str, garbled: str, redis_factory: RedisFactory
) -> None:
    store = redis_factory()
    app = make_app(broker=broker, dedupe_redis_url=store.url, accept_content=["json", GARBLED_TYPE])
    task = unique_task(app, unique_name("garbled"), serializer=garbled)

    @app.task(shared=False)
    def ping() -> str:
        return "pong"

    first = task.delay(7)
    assert first.deduplicated is False
    store.stop()

    with Lines("dedupe.redis") as lines, in_process_worker(app):
        assert ping.delay().get(timeout=20) == "pong"

    assert f"[{first.id}] was dropped unrun (undecodable body); its key was not freed" in lines.text


@pytest.fixture
def unknown_seen() -> Iterator[dict[str, threading.Event]]:
    """Set, by task id, once every receiver of ``task_unknown`` had the message (this one is
    connected after dedupe's)."""
    seen: dict[str, threading.Event] = {}

    def record(**kwargs: Any) -> None:
        seen.setdefault(str(kwargs.get("id")), threading.Event()).set()

    signals.task_unknown.connect(record, weak=False)
    yield seen
    signals.task_unknown.disconnect(record)


def test_a_dropped_message_leaves_a_newer_call_holding_its_key_and_says_nothing(
    make_app: Callable[..., Celery],
    app: Celery,
    side_queue: str,
    unknown_seen: dict[str, threading.Event],
) -> None:
    task = unique_task(app, unique_name("unknown"))
    worker_app = same_queue_and_keys(make_app, app)
    first = task.delay(7)
    # The first record goes (cleared by hand); a newer call, sent where no worker reads,
    # holds the key when the first message is dropped.
    assert dedupe.clear(task, (7,)) is True
    newer = task.apply_async((7,), queue=side_queue)
    assert newer.deduplicated is False

    with Lines("dedupe.keys") as lines, in_process_worker(worker_app):
        wait_for(
            lambda: first.id in unknown_seen and unknown_seen[first.id].is_set(),
            message=f"the worker dropped {first.id}",
        )

    holder = dedupe.lookup(task, (7,))
    assert holder is not None
    assert holder.task_id == newer.id
    assert holder.state == "queued"
    assert "freed" not in lines.text


def test_a_prefork_worker_frees_the_key_of_a_task_it_does_not_know(
    make_app: Callable[..., Celery], worker_app: Any, prefork_worker: WorkerProcess
) -> None:
    producer = make_app(
        broker=worker_app.BROKER,
        task_default_queue=worker_app.QUEUE,
        dedupe_redis_url=worker_app.STORE,
        dedupe_key_prefix=worker_app.PREFIX,
    )
    task = unique_task(producer, unique_name("unknown"))  # (not in tests.worker_app)

    first = task.delay(7)
    wait_for(
        lambda: dedupe.lookup(task, (7,)) is None,
        timeout=AT_ONCE,
        message=f"the key of the dropped {first.id} freed",
    )

    again = task.delay(7)
    assert again.deduplicated is False
    assert again.id != first.id
    line = f"[{first.id}] was dropped unrun (unregistered task)"
    wait_for(lambda: line in prefork_worker.tail(50000), message="the worker's line")
