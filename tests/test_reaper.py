"""The reaper frees a queued key whose message is gone where no worker sees it (issue 40):
a purge, a queue deleted, a broker's drop. It never frees the key of a message that waits in
a queue, that a worker holds, or that a later call holds.

Each test makes a unique call with no worker running, makes its message end (or not), and
lets the reaper's passes run: in a real worker's thread (``dedupe_reap_interval=1``), or one
:class:`~dedupe.runs.reaping.Reaper` pass after another where no worker is needed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery, signals
from celery.bootsteps import RUN
from celery.worker import state as worker_state
from kombu import Queue

import dedupe
from dedupe.recovery.held import held_requests
from dedupe.runs.reaping import Reaper
from dedupe.runs.runtime import runtime_of
from dedupe.values.keys import holds_keys
from dedupe.values.limits import limit_keys

from .conftest import in_process_worker, unique_name
from .helpers import Lines, keys_with_prefix, wait_for

pytestmark = pytest.mark.slow

#: Seconds within which the reaper frees a key whose message is gone (the issue's bound).
BOUND = 60.0

#: A reaper that sweeps every second, over calls older than a second.
REAPING = {"dedupe_reap_interval": 1, "dedupe_reap_margin": 1}


@pytest.fixture
def own_broker(broker: str, redis_factory: Any) -> str:
    """The test's broker: RabbitMQ, or a Redis of its own (a pass reads every message of its
    Redis broker, and the suite's shared one holds every other test's; the reaper then waits
    twenty times as long as such a pass took before the next)."""
    return broker if broker.startswith("amqp") else redis_factory().url


def unique_task(app: Celery, name: str | None = None) -> Any:
    @app.task(name=name or unique_name("reaped"), shared=False, base=dedupe.DedupeTask, unique=True)
    def echo(x: int) -> int:
        return x

    return echo


def queued(task: Any, *args: Any) -> Any:
    """Call ``task(*args)`` and check its key is queued under the call's task id."""
    result = task.apply_async(args)
    assert result.deduplicated is False
    holder = dedupe.lookup(task, args)
    assert holder is not None
    assert (holder.task_id, holder.state) == (result.id, "queued")
    return result


def two_passes(app: Celery, gap: float = 1.2) -> list[str]:
    """Two reaper passes, ``gap`` seconds apart, past the margin: the keys the second freed."""
    reaper = Reaper(runtime_of(app))
    time.sleep(app.conf.dedupe_reap_margin + 0.2)
    reaper.sweep()
    time.sleep(gap)
    return reaper.sweep().freed


def freed_by_a_worker(app: Celery, task: Any, first: Any) -> None:
    """A worker's reaper frees the key of ``first`` (whose message is gone) within
    :data:`BOUND`, saying so; the same call is then accepted again."""
    with Lines("dedupe.keys") as lines, in_process_worker(app):
        wait_for(
            lambda: dedupe.lookup(task, (7,)) is None,
            timeout=BOUND,
            message=f"the key of {first.id}, whose message is gone, freed",
        )
    assert f"{task.name}[{first.id}] has no message on the broker" in lines.text
    again = task.apply_async((7,))
    assert again.deduplicated is False
    assert again.id != first.id


def test_a_purged_message_has_its_key_freed_by_the_workers_reaper(
    make_app: Callable[..., Celery], own_broker: str
) -> None:
    app = make_app(broker=own_broker, **REAPING)
    task = unique_task(app)
    first = queued(task, 7)
    assert app.control.purge() == 1
    freed_by_a_worker(app, task, first)


def test_a_deleted_queue_has_its_messages_keys_freed(
    make_app: Callable[..., Celery], own_broker: str
) -> None:
    app = make_app(broker=own_broker, **REAPING)
    task = unique_task(app)
    first = queued(task, 7)
    with app.connection_for_write() as connection:
        # (Declared on this channel first: kombu's Redis transport deletes the bindings its
        # channel knows.)
        queue = app.amqp.queues[app.conf.task_default_queue].bind(connection.default_channel)
        queue.declare()
        queue.delete()
    freed_by_a_worker(app, task, first)


def test_a_message_waiting_in_its_queue_keeps_its_key(
    make_app: Callable[..., Celery], own_broker: str
) -> None:
    app = make_app(broker=own_broker, **REAPING)
    task = unique_task(app)
    first = queued(task, 7)
    assert two_passes(app) == []
    assert dedupe.lookup(task, (7,)).task_id == first.id  # type: ignore[union-attr]


def test_a_message_waiting_in_a_priority_list_keeps_its_key(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app(**REAPING)  # (a Redis broker keeps a list per priority)
    task = unique_task(app)
    first = task.apply_async((7,), priority=9)
    assert two_passes(app) == []
    assert dedupe.lookup(task, (7,)).task_id == first.id  # type: ignore[union-attr]


def test_a_message_a_worker_holds_keeps_its_key(
    make_app: Callable[..., Celery], own_broker: str
) -> None:
    # A countdown keeps the message in the worker's timer, received and not acked: in no
    # queue (RabbitMQ counts it nowhere; the worker says it holds it).
    app = make_app(broker=own_broker, **REAPING)
    task = unique_task(app)
    first = task.apply_async((7,), countdown=30)
    with in_process_worker(app) as worker:
        wait_for(
            lambda: any(r.id == first.id for r in _held(worker)),
            timeout=10,
            message="the worker holds the message",
        )
        runtime = runtime_of(app)
        written = holds_keys(app.conf.dedupe_key_prefix, "")[0]
        if not runtime.broker.lists_unacked:  # (else the pass reads kombu's unacked hash)
            wait_for(
                lambda: first.id in runtime.store.held(written),
                timeout=10,
                message="the worker's report of what it holds",
            )
        assert _freed_past_the_margin(runtime_of(app)) == []
    assert dedupe.lookup(task, (7,)).task_id == first.id  # type: ignore[union-attr]


def _freed_past_the_margin(runtime: Any) -> list[str]:
    """What two passes apart free, made as if 31 s on (past a countdown's eta and the margin)."""
    reaper = Reaper(runtime)
    at = time.time() + 31
    reaper.sweep(now=at)
    return reaper.sweep(now=at + 1.2).freed


def _held(worker: Any) -> list[Any]:
    from dedupe.recovery.held import held_requests

    return held_requests(worker.consumer)


def test_a_later_calls_record_is_never_freed_by_an_earlier_pass(
    make_app: Callable[..., Celery], own_broker: str
) -> None:
    # The first pass found the purged message's record; before the second, the key was
    # cleared and a new call took it, whose message waits: the second pass keeps it.
    app = make_app(broker=own_broker, **REAPING)
    task = unique_task(app)
    queued(task, 7)
    app.control.purge()
    reaper = Reaper(runtime_of(app))
    time.sleep(app.conf.dedupe_reap_margin + 0.2)
    assert reaper.sweep().suspects == 1
    dedupe.clear(task, (7,))
    later = queued(task, 7)
    assert reaper.sweep(now=time.time() + 5).freed == []
    assert dedupe.lookup(task, (7,)).task_id == later.id  # type: ignore[union-attr]


def test_a_record_the_first_pass_found_is_freed_only_by_the_second(
    make_app: Callable[..., Celery], own_broker: str
) -> None:
    app = make_app(broker=own_broker, **REAPING)
    task = unique_task(app)
    first = queued(task, 7)
    app.control.purge()
    reaper = Reaper(runtime_of(app))
    time.sleep(app.conf.dedupe_reap_margin + 0.2)
    # (The passes are given their time: a loaded machine's "right after" may be a second.)
    at = time.time()
    found = reaper.sweep(now=at)
    assert (found.suspects, found.freed) == (1, [])
    assert dedupe.lookup(task, (7,)).task_id == first.id  # type: ignore[union-attr]
    # A pass right after finds it again, but frees it only an interval after its finding.
    assert reaper.sweep(now=at + 0.5).freed == []
    assert len(reaper.sweep(now=at + 1.2).freed) == 1
    assert dedupe.lookup(task, (7,)) is None


def test_a_call_that_waits_in_its_keys_line_is_not_freed(
    make_app: Callable[..., Celery], redis_client: redis.Redis
) -> None:
    # A key_concurrency call that waits is held in its line, message and all: in no queue.
    app = make_app(**REAPING)
    task = unique_task(app)
    first = queued(task, 7)
    app.control.purge()
    (key,) = keys_with_prefix(redis_client, app.conf.dedupe_key_prefix)
    held = limit_keys(key.decode())["held"]
    redis_client.hset(held, first.id, b"P[]")
    try:
        assert two_passes(app) == []
        assert dedupe.lookup(task, (7,)).task_id == first.id  # type: ignore[union-attr]
    finally:
        redis_client.delete(held)
    assert len(two_passes(app)) == 1


def test_a_young_record_is_not_looked_at(make_app: Callable[..., Celery], own_broker: str) -> None:
    app = make_app(broker=own_broker, dedupe_reap_interval=1, dedupe_reap_margin=60)
    task = unique_task(app)
    queued(task, 7)
    app.control.purge()
    reaper = Reaper(runtime_of(app))
    assert reaper.sweep().candidates == 0
    assert reaper.sweep().freed == []


@pytest.fixture
def dropping_app(make_app: Callable[..., Celery], rabbitmq_url: str) -> Any:
    """An app on RabbitMQ whose queue, of this test's own, has ``queue_arguments`` (deleted
    after the test)."""
    made: list[tuple[Celery, str]] = []

    def make(**arguments: Any) -> Celery:
        name = unique_name("dropping")
        queue = Queue(name, routing_key=name, queue_arguments=arguments)
        app = make_app(broker=rabbitmq_url, task_queues=[queue], task_default_queue=name, **REAPING)
        made.append((app, name))
        return app

    yield make
    for app, name in made:
        with app.connection_for_write() as connection:
            connection.default_channel.queue_delete(name)


def test_a_message_rabbitmq_dropped_by_its_ttl_has_its_key_freed(dropping_app: Any) -> None:
    app = dropping_app(**{"x-message-ttl": 200})
    task = unique_task(app)
    first = queued(task, 7)
    wait_for(lambda: _depth(app) == 0, timeout=10, message="RabbitMQ dropped the message")
    freed_by_a_worker(app, task, first)


def _depth(app: Celery) -> int:
    with app.connection_for_write() as connection:
        queue = app.conf.task_default_queue
        return int(connection.default_channel.queue_declare(queue, passive=True)[1])


def test_a_message_rabbitmq_dropped_at_its_max_length_frees_its_key_not_the_kept_ones(
    dropping_app: Any,
) -> None:
    # x-max-length 1 (drop-head): the second call's message pushes the first's out.
    app = dropping_app(**{"x-max-length": 1})
    task = unique_task(app)
    queued(task, 1)
    kept = queued(task, 2)
    freed = two_passes(app)
    # The queue holds a message, the kept one: a queue that is not empty frees nothing.
    assert freed == []
    assert dedupe.lookup(task, (2,)).task_id == kept.id  # type: ignore[union-attr]
    # Once the kept one ran, the queue is empty: the dropped one's key goes.
    with in_process_worker(app):
        wait_for(lambda: dedupe.lookup(task, (1,)) is None, timeout=BOUND, message="freed")
    assert dedupe.lookup(task, (2,)) is None  # (it ran, and freed its own)


def test_only_one_worker_sweeps_at_a_time(make_app: Callable[..., Celery]) -> None:
    app = make_app(**REAPING)
    store = runtime_of(app).store
    lock = f"{app.conf.dedupe_key_prefix}:reaper"
    assert store.take_reaper(lock, b"celery@a", 5000)
    assert not store.take_reaper(lock, b"celery@b", 5000)
    assert store.take_reaper(lock, b"celery@a", 5000)  # (kept by its holder)


def test_the_reap_script_deletes_only_the_very_bytes_it_was_given(
    make_app: Callable[..., Celery], redis_client: redis.Redis
) -> None:
    app = make_app()
    store = runtime_of(app).store
    key = f"{app.conf.dedupe_key_prefix}:{{t:00}}"
    redis_client.set(key, b"record-a")
    assert store.reap([(key, b"record-b")]) == [False]
    assert redis_client.get(key) == b"record-a"
    assert store.reap([(key, b"record-a")]) == [True]
    assert redis_client.get(key) is None


def test_a_pass_reads_a_slice_of_the_keys_and_a_later_pass_frees_what_an_earlier_found(
    make_app: Callable[..., Celery],
) -> None:
    # A large keyspace is read a slice a pass: a suspect from one slice is looked at again
    # by the passes after, whichever slice they read.
    app = make_app(**REAPING)
    task = unique_task(app)
    for n in range(40):
        queued(task, n)
    app.control.purge()
    time.sleep(app.conf.dedupe_reap_margin + 0.2)
    reaper = Reaper(runtime_of(app))
    # (The passes are given their time: on a loaded machine back to back may take seconds.)
    at = time.time()
    first = reaper.sweep(at, keys=10)
    assert 0 < first.keys_read < 40
    assert not reaper.round_done
    while not reaper.round_done:
        assert reaper.sweep(at, keys=10).freed == []  # (none an interval apart)
    freed = reaper.sweep(at + 1.2, keys=0).freed
    assert len(freed) == 40
    assert all(dedupe.lookup(task, (n,)) is None for n in range(40))


def test_a_redis_brokers_global_key_prefix_is_looked_under(
    make_app: Callable[..., Celery],
) -> None:
    # kombu names the queues, bindings and unacked hash under the transport's prefix.
    app = make_app(broker_transport_options={"global_keyprefix": "gk:"}, **REAPING)
    task = unique_task(app)
    purged = queued(task, 1)
    app.control.purge()
    waiting = queued(task, 2)
    key = dedupe.lookup(task, (1,)).key  # type: ignore[union-attr]
    assert two_passes(app) == [key]
    assert dedupe.lookup(task, (1,)) is None
    assert dedupe.lookup(task, (2,)).task_id == waiting.id  # type: ignore[union-attr]
    assert purged.id != waiting.id


def test_a_key_that_is_no_utf8_under_the_prefix_does_not_stop_a_pass(
    make_app: Callable[..., Celery], own_broker: str, redis_client: redis.Redis
) -> None:
    app = make_app(broker=own_broker, **REAPING)
    redis_client.set(app.conf.dedupe_key_prefix.encode() + b":\xff\xfe", b"another program's")
    task = unique_task(app)
    queued(task, 7)
    app.control.purge()
    assert len(two_passes(app)) == 1
    assert dedupe.lookup(task, (7,)) is None


@pytest.mark.parametrize(
    "interval",
    [1, 60],
    ids=["reported while it ran", "received since its last report (kept as the shutdown began)"],
)
def test_a_worker_in_warm_shutdown_reports_what_it_holds_until_it_lets_go(
    make_app: Callable[..., Celery], rabbitmq_url: str, interval: int
) -> None:
    # A warm shutdown closes the consumer first (Celery forgets the messages it holds and has
    # not started) and waits for the runs after: meanwhile the worker still holds its
    # countdown's message, unacked (RabbitMQ counts it nowhere), and another worker's pass
    # must not free its key. (Reports come every half interval, 5 s at most.)
    app = make_app(broker=rabbitmq_url, **{**REAPING, "dedupe_reap_interval": interval})
    task = unique_task(app)

    @app.task(shared=False)
    def long_run(seconds: float) -> None:
        time.sleep(seconds)

    runtime = runtime_of(app)
    written = holds_keys(app.conf.dedupe_key_prefix, "")[0]
    with in_process_worker(app, pool="threads", concurrency=2) as worker:
        try:
            every = min(interval / 2, 5)
            long_run.delay(every + 4)
            wait_for(lambda: worker_state.active_requests, message="the long run started")
            first = task.apply_async((7,), countdown=30)
            wait_for(
                lambda: any(r.id == first.id for r in held_requests(worker.consumer)),
                message="the worker holds the message",
            )
            # What Celery's SIGTERM handler does: the signal, then a warm shutdown.
            signals.worker_shutting_down.send(
                sender=worker.hostname, sig="SIGTERM", how="Warm", exitcode=0
            )
            worker_state.should_stop = 0
            wait_for(lambda: worker.consumer.blueprint.state != RUN, message="the drain began")
            # (A report made since, its predecessor's life over: three report intervals.)
            time.sleep(max(every, 1.5) + 0.5)
            assert worker_state.active_requests  # (still draining)
            assert first.id in runtime.store.held(written)
            assert _freed_past_the_margin(runtime_of(app)) == []
        finally:
            worker_state.should_stop = None
    assert dedupe.lookup(task, (7,)).task_id == first.id  # type: ignore[union-attr]


def test_a_solo_worker_busy_in_a_run_keeps_the_keys_of_what_it_has_not_read(
    make_app: Callable[..., Celery], rabbitmq_url: str
) -> None:
    # The solo pool runs in the thread that reads the connection: what RabbitMQ sends under
    # the prefetch window meanwhile waits unread, unacked, counted in no queue, and no part
    # of Celery knows of it yet.
    app = make_app(broker=rabbitmq_url, **REAPING)
    task = unique_task(app)

    @app.task(shared=False)
    def long_run(seconds: float) -> None:
        time.sleep(seconds)

    with in_process_worker(app) as worker:
        long_run.delay(6)
        wait_for(lambda: worker_state.active_requests, message="the long run started")
        waiting = task.delay(7)
        time.sleep(1.5)  # (reports made since: every half interval)
        assert not any(r.id == waiting.id for r in held_requests(worker.consumer))
        assert _freed_past_the_margin(runtime_of(app)) == []
        assert dedupe.lookup(task, (7,)).task_id == waiting.id  # type: ignore[union-attr]
