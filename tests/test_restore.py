"""After the dedup Redis lost its data, the keys of the messages the Redis broker holds unacked
are written back: a worker killed with an ``acks_late`` message before the loss no longer lets
a call in after every run of its key until the visibility timeout gives the message back.

The store's restore transition against a real Redis; the broker's unacked hash as kombu
writes it; and the double fault itself with real prefork workers, killed and restarted.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgpack
import pytest
import redis
from celery import Celery
from kombu.transport import redis as kombu_redis

import dedupe
from dedupe.demo.server import RedisServer
from dedupe.recovery.unacked import Ours, RestartWatch, restorations, restore_unacked
from dedupe.runs.runtime import runtime_of
from dedupe.store.commands.leases import Lease
from dedupe.store.commands.restorations import Restoration
from dedupe.store.replies import Renewal, Requeue, Restore
from dedupe.store.store import Store
from dedupe.values import defaults
from dedupe.values.header import HEADER, KeyHeader
from dedupe.values.keys import CallKeys, alive_key
from dedupe.values.record import pack_provisional, pack_queued, pack_running

from .conftest import RedisFactory
from .helpers import (
    Lines,
    WorkerProcess,
    app_with_a_store_of_its_own,
    free_port,
    producer_stub,
    wait_for,
)

LEASE_MS = 5_000
TTL_MS = 60_000


@pytest.fixture
def keys(request: pytest.FixtureRequest) -> CallKeys:
    return CallKeys.of(
        f"restore:{{{request.node.name}:{uuid.uuid4().hex}}}", separate_run_lock=False
    )


def restoration(keys: CallKeys, task_id: str, lease_ms: int = LEASE_MS) -> Restoration:
    return Restoration.of(keys, task_id, time.time(), TTL_MS, lease_ms)


def restore(store: Store, keys: CallKeys, task_id: str, lease_ms: int = LEASE_MS) -> Restore:
    [reply] = store.restore([restoration(keys, task_id, lease_ms)])
    return reply


def claim(store: Store, keys: CallKeys, task_id: str, token: str) -> dedupe.Holder | None:
    # (acks_late: its record outlives the lease, up to the redelivery)
    now = int(time.time())
    return store.claim(keys, task_id, token, LEASE_MS, "h", 1, now, record_ttl_ms=TTL_MS)


def lease_over(store: Store, keys: CallKeys) -> None:
    fields = msgpack.unpackb(store.client.get(keys.run), raw=True)
    fields[5] = 0
    store.client.set(keys.run, msgpack.packb(fields, use_bin_type=False), px=TTL_MS)


def fields(store: Store, keys: CallKeys) -> list[Any]:
    found: list[Any] = msgpack.unpackb(store.client.get(keys.run), raw=True)
    return found


# -- the transition ---------------------------------------------------------------------------


def test_a_restored_key_holds_off_new_calls_with_the_messages_task_id(
    store: Store, keys: CallKeys
) -> None:
    assert restore(store, keys, "A") is Restore.RESTORED
    holder = store.enqueue(keys, pack_queued("B", time.time(), None), TTL_MS)
    assert holder is not None
    assert (holder.task_id, holder.state, holder.worker) == ("A", "running", "restored:0")
    assert store.client.pttl(keys.call) > LEASE_MS  # until the broker gives the message back


def test_the_live_run_of_the_message_takes_its_restored_key_back_as_its_own(
    store: Store, keys: CallKeys
) -> None:
    restore(store, keys, "A")
    record = pack_running("A", "t1", "h", 1, time.time())
    lease = Lease(keys.run, "A", "t1", LEASE_MS, record, TTL_MS)
    assert store.renew([lease]) == [Renewal.RECREATED]
    assert fields(store, keys)[1] == b"t1"
    assert store.renew([lease]) == [Renewal.RENEWED]


def test_the_live_run_of_the_message_frees_its_restored_key_at_its_end(
    store: Store, keys: CallKeys
) -> None:
    restore(store, keys, "A")
    assert store.release(keys, "A", "t1") == 1
    assert store.lookup(keys) is None


def test_a_retry_of_the_live_run_queues_over_its_restored_key(store: Store, keys: CallKeys) -> None:
    restore(store, keys, "A")
    queued = pack_queued("A", time.time(), None)
    assert store.requeue(keys, "A", "t1", queued, TTL_MS) is Requeue.QUEUED
    assert store.client.get(keys.call) == queued


def test_a_redelivered_copy_waits_for_the_restored_lease_then_takes_the_key_over(
    store: Store, keys: CallKeys
) -> None:
    restore(store, keys, "A")
    assert claim(store, keys, "A", "t2") is not None  # a live run may still take it back
    lease_over(store, keys)
    assert claim(store, keys, "A", "t2") is None
    assert fields(store, keys)[1] == b"t2"


def test_the_call_accepted_since_waits_in_the_restored_key_and_gets_it_after_the_message(
    store: Store, keys: CallKeys
) -> None:
    queued_b = pack_queued("B", time.time(), None)
    assert store.enqueue(keys, queued_b, TTL_MS) is None  # accepted while the key was lost
    assert restore(store, keys, "A") is Restore.JOINED
    assert store.enqueue(keys, pack_queued("C", time.time(), None), TTL_MS).task_id == "A"  # type: ignore[union-attr]
    lease_over(store, keys)  # the message comes back after the visibility timeout
    assert claim(store, keys, "A", "t1") is None
    assert store.release(keys, "A", "t1") == 1
    assert store.client.get(keys.call) == queued_b


def test_a_message_whose_key_a_run_holds_waits_in_that_run(store: Store, keys: CallKeys) -> None:
    assert claim(store, keys, "B", "t1") is None
    assert restore(store, keys, "A") is Restore.JOINED
    assert store.release(keys, "B", "t1") == 1
    holder = store.lookup(keys)
    assert holder is not None
    assert (holder.task_id, holder.state) == ("A", "queued")


def test_a_key_that_holds_the_messages_own_record_is_left_alone(
    store: Store, keys: CallKeys
) -> None:
    queued = pack_queued("A", time.time(), None)
    store.enqueue(keys, queued, TTL_MS)
    assert restore(store, keys, "A") is Restore.OWN
    assert store.client.get(keys.call) == queued


def test_a_call_being_published_into_the_key_is_left_to_publish(
    store: Store, keys: CallKeys
) -> None:
    provisional = pack_provisional("B", 1)
    store.client.set(keys.call, provisional, px=TTL_MS)
    assert restore(store, keys, "A") is Restore.PENDING
    assert store.client.get(keys.call) == provisional


def test_a_restored_key_whose_message_was_acked_meanwhile_is_withdrawn(
    store: Store, keys: CallKeys
) -> None:
    queued_b = pack_queued("B", time.time(), None)
    store.enqueue(keys, queued_b, TTL_MS)
    item = restoration(keys, "A")
    store.restore([item])
    assert store.withdraw(item) is True
    assert store.client.get(keys.call) == queued_b  # the call waiting in it has the key again


def test_withdrawing_a_restored_key_leaves_the_live_run_that_took_it_back(
    store: Store, keys: CallKeys
) -> None:
    item = restoration(keys, "A")
    store.restore([item])
    record = pack_running("A", "t1", "h", 1, time.time())
    store.renew([Lease(keys.run, "A", "t1", LEASE_MS, record, TTL_MS)])
    assert store.withdraw(item) is False
    assert fields(store, keys)[1] == b"t1"


def test_a_message_restored_into_a_run_that_was_acked_meanwhile_leaves_that_run(
    store: Store, keys: CallKeys
) -> None:
    claim(store, keys, "B", "t1")
    item = restoration(keys, "A")
    assert store.restore([item]) == [Restore.JOINED]  # A waits in B's run
    assert store.withdraw(item) is True
    assert store.release(keys, "B", "t1") == 1
    assert store.lookup(keys) is None


def test_withdrawing_leaves_the_record_the_messages_next_try_wrote(
    store: Store, keys: CallKeys
) -> None:
    # The message went on as a new message of its task id (a deferral), whose next try took
    # its place ahead of a call accepted since: not the record the restore wrote.
    item = restoration(keys, "A")
    queued_b = pack_queued("B", time.time(), None)
    store.enqueue(keys, queued_b, TTL_MS)
    store.wait(keys, "A", pack_queued("A", time.time(), None), TTL_MS, time.time() - 5)
    assert store.withdraw(item) is False
    holder = store.lookup(keys)
    assert holder is not None
    assert holder.task_id == "A"


def test_withdrawing_leaves_the_place_the_messages_next_try_took_in_a_run(
    store: Store, keys: CallKeys
) -> None:
    claim(store, keys, "B", "t1")
    item = restoration(keys, "A")
    store.wait(keys, "A", pack_queued("A", time.time(), None), TTL_MS)  # A waits in B's run
    assert store.withdraw(item) is False
    assert store.release(keys, "B", "t1") == 1
    holder = store.lookup(keys)
    assert holder is not None
    assert holder.task_id == "A"


# unique_until="started": the call's record key is restored; the run holds the run lock.


@pytest.fixture
def started(request: pytest.FixtureRequest) -> CallKeys:
    return CallKeys.of(
        f"restore:{{{request.node.name}:{uuid.uuid4().hex}}}", separate_run_lock=True
    )


def claim_started(store: Store, keys: CallKeys, task_id: str, token: str) -> dedupe.Holder | None:
    return store.claim(keys, task_id, token, LEASE_MS, "h", 1, int(time.time()))


def test_a_started_message_frees_its_restored_key_when_it_starts(
    store: Store, started: CallKeys
) -> None:
    restore(store, started, "A")
    assert store.enqueue(started, pack_queued("B", time.time(), None), TTL_MS) is not None
    assert claim_started(store, started, "A", "t1") is None
    assert store.client.exists(started.call) == 0


def test_a_started_message_hands_its_restored_key_to_the_call_accepted_since_when_it_starts(
    store: Store, started: CallKeys
) -> None:
    queued_b = pack_queued("B", time.time(), None)
    store.enqueue(started, queued_b, TTL_MS)
    assert restore(store, started, "A") is Restore.JOINED
    assert claim_started(store, started, "A", "t1") is None
    assert store.client.get(started.call) == queued_b


def test_the_heartbeat_of_a_started_run_withdraws_its_restored_call_key(
    store: Store, started: CallKeys
) -> None:
    # The message was running when Redis lost its data: it holds the run lock, not the call.
    assert claim_started(store, started, "A", "t1") is None
    store.client.delete(started.run)
    restore(store, started, "A")
    record = pack_running("A", "t1", "h", 1, time.time())
    lease = Lease(started.run, "A", "t1", LEASE_MS, record, 0, started.call)
    assert store.renew([lease]) == [Renewal.RECREATED]
    assert store.client.exists(started.call) == 0
    assert store.enqueue(started, pack_queued("B", time.time(), None), TTL_MS) is None


def test_a_started_message_whose_run_holds_its_run_lock_is_not_restored_into_its_call_key(
    store: Store, started: CallKeys
) -> None:
    # It runs (its heartbeat re-created the run lock first): calls made now go after it,
    # as they would have before the loss, not answered with a run that has begun.
    assert claim_started(store, started, "A", "t1") is None
    assert restore(store, started, "A") is Restore.RUNNING
    assert store.client.exists(started.call) == 0
    assert store.enqueue(started, pack_queued("B", time.time(), None), TTL_MS) is None


# -- what is restored, from kombu's unacked hash -------------------------------------------


def unacked(task_id: str, header: str | None, task: str = "proj.work") -> bytes:
    headers: dict[str, Any] = {"id": task_id, "task": task, "lang": "py"}
    if header is not None:
        headers[HEADER] = header
    message = {"body": "", "headers": headers, "properties": {"delivery_tag": "x"}}
    return json.dumps([message, "", "celery"]).encode()


def test_the_unique_finished_messages_are_restored_until_the_broker_gives_them_back() -> None:
    messages = {
        b"t1": unacked("A", "finished|60.0|dedupe:{proj.work:aa}"),
        b"t2": unacked("B", "window|60.0|dedupe:{proj.work:bb}"),  # the key is the window
        b"t3": unacked("C", None),  # no unique call
        b"t6": unacked("D", "started|60.0|dedupe:{proj.work:dd}"),
        b"t4": b"not json",
        b"t5": json.dumps([{"body": "", "headers": {}}, "", ""]).encode(),  # protocol 1
    }
    now = 1_000_000.0
    ours = Ours("dedupe")
    items = restorations(messages, {b"t1": now - 10}, ours, now, lease=6.0, redelivery=30.0)
    assert list(items) == [b"t1", b"t6"]
    task, item = items[b"t1"]
    assert (task, item.task_id, item.keys.call) == ("proj.work", "A", "dedupe:{proj.work:aa}")
    assert item.lease_ms == 6000
    assert item.ttl_ms == 26_000  # delivered 10 s ago: 30 s to the redelivery, a lease more


def test_a_message_past_its_redelivery_is_restored_for_a_lease() -> None:
    keys = CallKeys.of("dedupe:{w:aa}", separate_run_lock=False)
    messages = {b"t": unacked("A", KeyHeader(keys, "finished", None).encode(), "w")}
    items = restorations(messages, {b"t": 0.0}, Ours("dedupe"), 1e3, 6, 30)
    assert items[b"t"][1].ttl_ms == 6000


def test_messages_whose_keys_have_another_prefix_are_left_alone() -> None:
    messages = {b"t1": unacked("A", "finished|60.0|other:{proj.work:aa}")}
    assert restorations(messages, {}, Ours("dedupe"), 1e3, 6, 30) == {}


def test_messages_of_tasks_this_process_never_imported_are_restored() -> None:
    # A web process's app knows the tasks it calls, not all the broker holds: the key prefix
    # tells whose keys live in this store.
    messages = {b"t2": unacked("B", "finished|60.0|dedupe:{billing.charge:bb}", "billing.charge")}
    assert list(restorations(messages, {}, Ours("dedupe"), 1e3, 6, 30)) == [b"t2"]


@pytest.fixture
def broker_app(redis_factory: RedisFactory, tag: str) -> Iterator[Celery]:
    """An app whose Redis broker and dedup Redis are two private servers."""
    with _broker_app(redis_factory, tag) as app:
        yield app


@pytest.fixture(params=["", "x_"], ids=["no-keyprefix", "global-keyprefix"])
def any_broker_app(
    redis_factory: RedisFactory, tag: str, request: pytest.FixtureRequest
) -> Iterator[Celery]:
    """The same, with and without the transport's ``global_keyprefix``."""
    with _broker_app(redis_factory, tag, global_keyprefix=request.param) as app:
        yield app


@contextmanager
def _broker_app(
    redis_factory: RedisFactory,
    tag: str,
    broker: RedisServer | None = None,
    dedup: RedisServer | None = None,
    **transport: Any,
) -> Iterator[Celery]:
    broker, dedup = broker or redis_factory(), dedup or redis_factory()
    app = Celery("restore", broker=broker.url, set_as_current=False)
    app.conf.update(
        task_default_queue=f"restore-{tag}",
        dedupe_redis_url=dedup.url,
        dedupe_default_lease=6,
        broker_transport_options=transport,
    )
    dedupe.install(app)
    yield app
    app.close()


def test_a_worker_restores_the_key_of_a_message_kombu_holds_unacked(
    any_broker_app: Celery,
) -> None:
    broker_app = any_broker_app

    @broker_app.task(base=dedupe.DedupeTask, unique=True, shared=False)
    def work(n: int) -> None: ...

    restored: list[dict[str, Any]] = []

    def on_restored(**kwargs: Any) -> None:
        restored.append(kwargs)

    dedupe.events.key_restored.connect(on_restored)
    result = work.delay(1)
    runtime = runtime_of(broker_app)
    with broker_app.connection_for_write() as connection:
        message = connection.default_channel.basic_get(broker_app.conf.task_default_queue)
        assert message is not None  # delivered, not acked: in kombu's unacked hash
        runtime.store.client.flushall()  # the dedup Redis lost its data
        time.sleep(1.0)
        try:
            assert restore_unacked(broker_app, runtime.store, "dedupe", 6.0, 30.0) == 1
        finally:
            dedupe.events.key_restored.disconnect(on_restored)
        # Held until the broker gives the message back, counted from its delivery (kombu's
        # index of the unacked messages, read under the prefix too), a second ago.
        [key] = runtime.store.client.scan_iter("dedupe:{*")
        assert 0 < runtime.store.client.pttl(key) <= (30 + 6 - 0.9) * 1000
        assert work.delay(1).id == result.id
        assert [(r["task_name"], r["task_id"]) for r in restored] == [(work.name, result.id)]
        message.ack()
    assert restore_unacked(broker_app, runtime.store, "dedupe", 6.0, 30.0) == 0  # none unacked


@pytest.fixture
def brokerless_app(redis_factory: RedisFactory) -> Iterator[Celery]:
    """An app whose dedup Redis answers and whose Redis broker never does."""
    dedup = redis_factory()
    app = Celery("restore", broker=f"redis://127.0.0.1:{free_port()}/0", set_as_current=False)
    app.conf.update(dedupe_redis_url=dedup.url, broker_connection_timeout=0.5)
    dedupe.install(app)
    yield app
    app.close()


def test_a_restore_the_broker_cut_short_is_tried_again_at_the_next_check(
    brokerless_app: Celery,
) -> None:
    app = brokerless_app
    store = runtime_of(app).store
    watch = RestartWatch(app, store, "dedupe", 6.0, 30.0)
    with Lines("dedupe.keys") as lines:
        watch()
        assert watch._restoring is not None
        watch._restoring.join(timeout=30)
    assert "could not restore the keys of unacked messages" in lines.text
    assert store.client.exists(alive_key("dedupe")) == 0  # the next check restores again
    assert not watch.armed()  # calls meanwhile are decided without waiting on the broker


# -- no call decided before the restore -------------------------------------------------------


def _unacked_then_lost(app: Celery, task: Any, *args: Any) -> tuple[Any, Any]:
    """A call whose message a worker took (kombu's unacked hash holds it), then the dedup
    Redis lost every key: (the call's result, the message, to ack)."""
    result = task.delay(*args)
    connection = app.connection_for_write()
    message = connection.default_channel.basic_get(app.conf.task_default_queue)
    assert message is not None
    runtime_of(app).store.client.flushall()
    return result, (connection, message)


def _ack(held: tuple[Any, Any]) -> None:
    connection, message = held
    message.ack()
    connection.release()


def test_a_message_acked_just_after_the_restore_frees_its_restored_key(
    broker_app: Celery,
) -> None:
    # acks_late: a run frees its key, then its worker acks. A run that ended during the
    # restore left its message unacked at the restore's own check: its restored record
    # must not hold a finished task's key for the visibility timeout.
    @broker_app.task(base=dedupe.DedupeTask, unique=True, shared=False)
    def work(n: int) -> None: ...

    first, held = _unacked_then_lost(broker_app, work, 1)
    store = runtime_of(broker_app).store
    assert restore_unacked(broker_app, store, "dedupe", 6.0, 30.0) == 1
    holder = dedupe.lookup(work, (1,))
    assert holder is not None
    assert holder.task_id == first.id
    _ack(held)
    wait_for(lambda: dedupe.lookup(work, (1,)) is None, timeout=5, message="key withdrawn")
    assert not work.delay(1).deduplicated


def test_a_message_back_in_its_queue_keeps_its_restored_key(
    redis_factory: RedisFactory, tag: str
) -> None:
    # Past its visibility timeout a message leaves the unacked hash for its queue, unacked:
    # gone from the hash is then no ack, and its key stays.
    with _broker_app(redis_factory, tag, visibility_timeout=1) as app:

        @app.task(base=dedupe.DedupeTask, unique=True, shared=False)
        def work(n: int) -> None: ...

        first, held = _unacked_then_lost(app, work, 1)
        store = runtime_of(app).store
        assert restore_unacked(app, store, "dedupe", 6.0, 30.0) == 1
        time.sleep(1.1)
        connection, _ = held
        connection.default_channel.qos.restore_visible()  # kombu's sweep: back in its queue
        assert connection.default_channel.client.llen(app.conf.task_default_queue) == 1
        time.sleep(2)  # (past the follower's looks)
        holder = dedupe.lookup(work, (1,))
        assert holder is not None
        assert holder.task_id == first.id
        connection.release()


def test_a_restart_from_a_snapshot_restores_the_keys_written_since(
    redis_factory: RedisFactory, tag: str
) -> None:
    # The snapshot holds the marker, not the records written after it: a marker of an
    # earlier run of the server is no proof that nothing was lost.
    broker, dedup = redis_factory(), redis_factory()
    with _broker_app(redis_factory, tag, broker=broker, dedup=dedup) as app:

        @app.task(base=dedupe.DedupeTask, unique=True, shared=False)
        def work(n: int) -> None: ...

        watch = runtime_of(app).store.barrier
        assert isinstance(watch, RestartWatch)
        watch.restore()  # (a healthy server: the marker of this run)
        admin = redis.Redis.from_url(dedup.url)
        admin.save()
        first = work.delay(1)
        connection = app.connection_for_write()
        assert connection.default_channel.basic_get(app.conf.task_default_queue) is not None
        dedup.stop()  # a crash; the server starts again from its snapshot
        dedup.start()
        assert admin.exists(alive_key("dedupe")) == 1
        assert dedupe.lookup(work, (1,)) is None  # (the record was written after the snapshot)
        watch()
        assert watch._restoring is not None
        watch._restoring.join(timeout=30)
        holder = dedupe.lookup(work, (1,))
        assert holder is not None
        assert holder.task_id == first.id
        marker = admin.get(alive_key("dedupe"))
        assert marker.split(b"/")[0] == admin.info("server")["run_id"].encode()
        connection.release()


def test_the_heartbeats_check_restores_then_sets_the_marker(broker_app: Celery) -> None:
    @broker_app.task(base=dedupe.DedupeTask, unique=True, shared=False)
    def work(n: int) -> None: ...

    first, held = _unacked_then_lost(broker_app, work, 1)
    watch = runtime_of(broker_app).store.barrier
    assert isinstance(watch, RestartWatch)
    watch()  # (the heartbeat thread's call, every third of a lease)
    assert watch._restoring is not None
    watch._restoring.join(timeout=30)
    holder = dedupe.lookup(work, (1,))
    assert holder is not None
    assert holder.task_id == first.id
    assert runtime_of(broker_app).store.client.exists(alive_key("dedupe")) == 1
    _ack(held)


@pytest.mark.parametrize("decide_first", [False, True], ids=["overlap", "confirm"])
def test_a_call_after_the_loss_waits_for_the_restore_and_is_a_duplicate(
    broker_app: Celery, decide_first: bool
) -> None:
    @broker_app.task(base=dedupe.DedupeTask, unique=True, shared=False)
    def work(n: int) -> None: ...

    first, held = _unacked_then_lost(broker_app, work, 1)
    runtime = runtime_of(broker_app)
    if decide_first:  # (a task of mostly duplicates asks before it builds the message)
        runtime.duplicate_share[work.name] = 1.0
    again = work.delay(1)
    assert (again.deduplicated, again.id) == (True, first.id)
    assert runtime.store.client.exists(alive_key("dedupe")) == 1
    _ack(held)


def test_a_batch_after_the_loss_waits_for_the_restore(broker_app: Celery) -> None:
    @broker_app.task(base=dedupe.DedupeTask, unique=True, shared=False)
    def work(n: int) -> None: ...

    first, held = _unacked_then_lost(broker_app, work, 1)
    results = work.map_unique([(1,), (2,)])
    assert [(r.deduplicated, r.id == first.id) for r in results] == [(True, True), (False, False)]
    _ack(held)


def test_an_asyncio_call_after_the_loss_waits_for_the_restore(broker_app: Celery) -> None:
    @broker_app.task(base=dedupe.DedupeTask, unique=True, shared=False)
    def work(n: int) -> None: ...

    first, held = _unacked_then_lost(broker_app, work, 1)
    again = asyncio.run(work.adelay_unique(1))
    assert (again.deduplicated, again.id) == (True, first.id)
    _ack(held)


def test_calls_are_decided_without_the_restore_while_the_broker_fails_it(
    brokerless_app: Celery,
) -> None:
    store = runtime_of(brokerless_app).store
    assert isinstance(store.barrier, RestartWatch)
    keys = CallKeys.of("dedupe:{proj.work:aa}", separate_run_lock=False)
    with Lines("dedupe.keys") as lines:
        assert store.enqueue(keys, pack_provisional("A", 1), TTL_MS) is None  # accepted
    assert "could not restore the keys of unacked messages" in lines.text
    with Lines("dedupe.keys") as lines:
        store.enqueue(keys, pack_provisional("B", 2), TTL_MS)
    # (Disarmed: not asked again at every call.)
    assert lines.text_of(threading.get_ident()) == ""


def test_a_store_that_is_also_the_broker_has_no_restore(redis_factory: RedisFactory) -> None:
    # Its loss takes the unacked messages with it: nothing to restore, no call to hold back.
    server = redis_factory()
    app = Celery("restore", broker=server.url, set_as_current=False)
    app.conf.update(dedupe_redis_url=server.url)
    dedupe.install(app)
    assert runtime_of(app).store.barrier is None
    app.close()


# -- the double fault, with real workers -------------------------------------------------------

#: The broker's visibility timeout: long enough for the restore and a call before the
#: killed worker's message comes back.
VISIBILITY = 15.0


@pytest.fixture
def producer(worker_app: Any, tag: str, redis_factory: RedisFactory) -> Iterator[Celery]:
    with app_with_a_store_of_its_own(
        worker_app, worker_app.BROKER, f"restore-{tag}", redis_factory()
    ) as app:
        yield app


#: A kombu that takes the sweep's period from the transport options (the test workers sweep
#: every second); an older one sweeps the unacked messages every 100 s, whatever they say.
KOMBU_SWEEPS_AS_TOLD = hasattr(kombu_redis.Channel, "unacked_restore_throttle")


@pytest.mark.slow
@pytest.mark.skipif(
    not KOMBU_SWEEPS_AS_TOLD,
    reason="this kombu gives an unacked message back only every 100 s: past the test's wait",
)
def test_a_dead_workers_unacked_message_keeps_its_key_through_a_dedup_redis_restart(
    worker_app: Any, producer: Celery, tag: str
) -> None:
    @producer.task(
        name=worker_app.redelivered.name,
        bind=True,
        base=dedupe.DedupeTask,
        unique=True,
        acks_late=True,
        shared=False,
    )
    def redelivered(self: Any, tag: str, seconds: float) -> str: ...

    @producer.task(
        name=worker_app.sleepy.name, bind=True, base=dedupe.DedupeTask, unique=True, shared=False
    )
    def sleepy(self: Any, tag: str, seconds: float) -> str: ...

    store = producer.store_server  # type: ignore[attr-defined]
    env = {
        "DEDUPE_TEST_QUEUE": producer.conf.task_default_queue,
        "DEDUPE_TEST_STORE": store.url,
        "DEDUPE_TEST_VISIBILITY": str(VISIBILITY),
    }
    broker = redis.Redis.from_url(worker_app.BROKER)
    first, second = WorkerProcess(producer, env), WorkerProcess(producer, env)
    first.start()
    try:
        result = redelivered.apply_async((tag, 30))
        # The body's start, not just the claim: the kill must come after the run began (the
        # redelivery then runs for a second).
        wait_for(lambda: worker_app.runlog(tag).runs(), message="the first run's start")
        holder = dedupe.lookup(redelivered, (tag, 30))
        assert holder is not None
        assert holder.state == "running"
        assert first.process is not None
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait()
        store.stop()
        store.start()  # the dedup Redis lost every key; the message is unacked in the broker
        assert dedupe.lookup(redelivered, (tag, 30)) is None
        second.start()
        other = sleepy.delay(f"{tag}-other", 6)  # a run, so that the worker's heartbeat beats
        wait_for(
            lambda: dedupe.lookup(redelivered, (tag, 30)) is not None,
            timeout=8,
            message="the key of the dead worker's message, restored",
        )
        assert any(result.id.encode() in value for value in broker.hvals("unacked"))
        again = redelivered.apply_async((tag, 30))
        assert again.deduplicated is True
        assert again.id == result.id
        assert result.get(timeout=VISIBILITY + 20) == tag  # the message came back and ran
        other.get(timeout=20)
    finally:
        first.stop()
        second.stop()
        broker.close()
    assert [run[0] for run in worker_app.runlog(tag).runs()] == [result.id, result.id]


#: A worker lease whose beats (a third of it) come long after the loss: what a call made
#: during its run meets is then the restore's doing, not the beat's.
LONG_LEASE = 30.0


@pytest.fixture
def long_lease_producer(worker_app: Any, tag: str, redis_factory: RedisFactory) -> Iterator[Celery]:
    with app_with_a_store_of_its_own(
        worker_app,
        worker_app.BROKER,
        f"restore-{tag}",
        redis_factory(),
        dedupe_default_lease=LONG_LEASE,
    ) as app:
        yield app


@pytest.mark.slow
def test_a_call_made_during_a_started_run_after_a_dedup_redis_restart_is_accepted_and_runs_next(
    worker_app: Any, long_lease_producer: Celery, tag: str
) -> None:
    # unique_until="started": a call made during a run runs after it. The running message
    # (acks_late) is unacked in the broker like a queued one: the restore must not answer
    # calls with it, nor let the call's run start beside it.
    producer = long_lease_producer
    started_mode = producer_stub(
        producer, worker_app.started_acks_late, unique_until="started", acks_late=True
    )
    store = producer.store_server  # type: ignore[attr-defined]
    env = {
        "DEDUPE_TEST_QUEUE": producer.conf.task_default_queue,
        "DEDUPE_TEST_STORE": store.url,
        "DEDUPE_TEST_LEASE": str(LONG_LEASE),
    }
    worker = WorkerProcess(producer, env)
    worker.start()
    try:
        # (The first run lasts well past the looks below, however slow the machine.)
        first = started_mode.delay(tag, 10)
        wait_for(lambda: worker_app.runlog(tag).runs(), message="the first run's start")
        store.stop()
        store.start()  # the dedup Redis lost every key; the running message is unacked
        again = started_mode.delay(tag, 10)  # (decided once the restore finished)
        assert again.deduplicated is False
        assert started_mode.delay(tag, 10).id == again.id  # queued: the next call's duplicate
        # Past the restore of the "started" messages, a few looks of the worker's beat later.
        time.sleep(defaults.STARTED_RESTORE_PAUSE + 1.5)
        holder = dedupe.lookup(started_mode, (tag, 10))
        assert holder is not None
        assert (holder.task_id, holder.state) == (again.id, "queued")
        assert first.get(timeout=60) == tag
        assert again.get(timeout=60) == tag
    finally:
        worker.stop()
    log = worker_app.runlog(tag)
    assert [run[0] for run in log.runs()] == [first.id, again.id]
    assert log.overlaps() == []
