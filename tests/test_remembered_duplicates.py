"""A repeated duplicate is answered from memory, and only while Redis has said nothing of its
key: Redis pushes an invalidation (client-side caching, ``CLIENT TRACKING``) the moment the
key is written, expires or is flushed, and a lost connection forgets everything.

Each test's dedup store is a private server, so its commands can be counted and the server
flushed, restarted or frozen."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

import dedupe
from dedupe import events
from dedupe.demo.server import RedisServer
from dedupe.producer.guard import keys_of_call
from dedupe.runs.runtime import runtime_of

from .conftest import RedisFactory, in_process_worker
from .helpers import wait_for
from .proxies import RedisProxy


def evalsha_calls(server: RedisServer) -> int:
    client = redis.Redis.from_url(server.url, protocol=2)
    try:
        stats: dict[str, Any] = client.info("commandstats")
    finally:
        client.close()
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.fixture
def store_server(redis_factory: RedisFactory) -> RedisServer:
    return redis_factory()


@pytest.fixture
def make_store_app(
    make_app: Callable[..., Any], broker: str, store_server: RedisServer
) -> Callable[..., Any]:
    """An app on ``broker`` whose dedup store is the private server."""

    def make(**conf: Any) -> Any:
        conf.setdefault("dedupe_remember_duplicates", 1)  # (off by default)
        return make_app(broker, dedupe_redis_url=store_server.url, **conf)

    return make


@pytest.fixture
def store_app(make_store_app: Callable[..., Any]) -> Any:
    return make_store_app()


def unique_task(app: Any, **options: Any) -> Any:
    @app.task(base=dedupe.DedupeTask, unique=True, shared=False, **options)
    def refresh(x: int) -> int:
        return x

    return refresh


def mostly_duplicates(task: Any) -> None:
    """Make the task's recent calls mostly duplicates: its calls decide before publishing,
    and their duplicates' answers are remembered."""
    runtime_of(task.app).duplicate_share[task.name] = 1.0


def remembered(task: Any, *args: Any) -> Any:
    """Queue a call of ``task`` and make its duplicate's answer remembered: the holder."""
    first = task.delay(*args)
    assert first.deduplicated is False
    mostly_duplicates(task)
    assert task.delay(*args).deduplicated is True  # asks Redis
    assert task.delay(*args).deduplicated is True  # asks Redis, tracked, and remembers
    return first


def test_a_repeated_duplicate_is_answered_without_a_round_trip(
    store_app: Any, store_server: RedisServer
) -> None:
    refresh = unique_task(store_app)
    first = remembered(refresh, 1)
    before = evalsha_calls(store_server)
    answers = [refresh.delay(1) for _ in range(5)]
    assert [(a.deduplicated, a.id) for a in answers] == [(True, first.id)] * 5
    assert evalsha_calls(store_server) == before


def test_a_remembered_answer_names_the_holder_as_redis_did(store_app: Any) -> None:
    refresh = unique_task(store_app)
    first = remembered(refresh, 2)
    asked = dedupe.lookup(refresh, (2,))
    answer = refresh.delay(2)
    assert asked is not None
    assert answer.holder is not None
    assert (answer.holder.task_id, answer.holder.state) == (first.id, "queued")
    assert answer.holder.key == asked.key
    assert answer.holder.ttl is not None
    assert asked.ttl is not None
    assert 0 < answer.holder.ttl <= asked.ttl + 0.001


def _accepted_on_redis_word(task: Any, *args: Any) -> Any:
    """Call until a call is accepted: a change made on another connection reaches this
    thread with Redis's word, a moment after the change (the opt-in's contract, see
    docs/known-limits.md); an app that remembers for 30 s shows that it came."""

    def accepted() -> Any:
        result = task.delay(*args)
        return None if result.deduplicated else result

    return wait_for(accepted, timeout=2, message="a call accepted on Redis's word")


def test_a_key_freed_on_another_connection_takes_the_next_call(
    make_store_app: Callable[..., Any], store_server: RedisServer
) -> None:
    refresh = unique_task(make_store_app(dedupe_remember_duplicates=30))
    first = remembered(refresh, 3)
    holder = dedupe.lookup(refresh, (3,))
    assert holder is not None
    other = redis.Redis.from_url(store_server.url)
    try:
        assert other.delete(holder.key) == 1
    finally:
        other.close()
    again = _accepted_on_redis_word(refresh, 3)
    assert again.id != first.id


def test_a_key_released_by_this_process_takes_the_next_call(store_app: Any) -> None:
    refresh = unique_task(store_app)
    remembered(refresh, 4)
    assert dedupe.clear(refresh, (4,)) is True
    assert refresh.delay(4).deduplicated is False


def test_a_key_whose_run_ended_takes_the_next_call(make_store_app: Callable[..., Any]) -> None:
    app = make_store_app(dedupe_remember_duplicates=30)
    refresh = unique_task(app)
    first = remembered(refresh, 5)
    with in_process_worker(app):
        assert first.get(timeout=20) == 5
        again = _accepted_on_redis_word(refresh, 5)
        assert again.id != first.id
        assert again.get(timeout=20) == 5


def test_a_claimed_key_answers_with_its_running_record(store_app: Any) -> None:
    @store_app.task(base=dedupe.DedupeTask, unique=True, shared=False)
    def slow(x: int) -> int:
        time.sleep(2)
        return x

    first = remembered(slow, 6)
    with in_process_worker(store_app):
        wait_for(
            lambda: (h := dedupe.lookup(slow, (6,))) is not None and h.state == "running",
            message="the run claimed its key",
        )
        answer = slow.delay(6)
        assert answer.deduplicated is True
        assert answer.holder is not None
        assert (answer.holder.task_id, answer.holder.state) == (first.id, "running")
        assert first.get(timeout=20) == 6


def test_a_key_that_expired_takes_the_next_call(store_app: Any) -> None:
    refresh = unique_task(store_app, unique_ttl=0.5)
    first = remembered(refresh, 7)
    time.sleep(0.6)
    again = refresh.delay(7)
    assert again.deduplicated is False
    assert again.id != first.id


def test_a_store_flushed_by_another_client_forgets_every_remembered_answer_on_its_word(
    make_store_app: Callable[..., Any], store_server: RedisServer
) -> None:
    # Redis's word (the invalidation) comes on this thread's connection a moment after the
    # flusher's reply: a call made in between may still be answered from memory (why
    # remembering is off by default), never one made after it, and never for the 30 s.
    refresh = unique_task(make_store_app(dedupe_remember_duplicates=30))
    remembered(refresh, 8)
    other = redis.Redis.from_url(store_server.url)
    try:
        other.flushall()
    finally:
        other.close()
    wait_for(lambda: refresh.delay(8).deduplicated is False, timeout=2, message="accepted")


def test_remembering_is_off_by_default(
    make_app: Callable[..., Any], broker: str, store_server: RedisServer
) -> None:
    refresh = unique_task(make_app(broker, dedupe_redis_url=store_server.url))
    refresh.delay(12)
    for _ in range(3):
        before = evalsha_calls(store_server)
        assert refresh.delay(12).deduplicated is True
        assert evalsha_calls(store_server) == before + 1


def test_a_restarted_store_forgets_every_remembered_answer(
    store_app: Any, store_server: RedisServer
) -> None:
    refresh = unique_task(store_app)
    remembered(refresh, 9)
    store_server.stop()
    store_server.start()
    assert refresh.delay(9).deduplicated is False


def test_a_remembered_answer_lasts_no_longer_than_dedupe_remember_duplicates(
    make_store_app: Callable[..., Any], store_server: RedisServer
) -> None:
    # A frozen server says nothing, as a connection cut without a word would: the answer
    # stands for the setting's time at most, then the call asks, and meets the freeze.
    app = make_store_app(
        dedupe_remember_duplicates=0.5, dedupe_call_budget=0.5, dedupe_on_redis_error="raise"
    )
    refresh = unique_task(app)
    remembered(refresh, 10)
    store_server.pause()
    try:
        time.sleep(0.6)
        with pytest.raises(dedupe.RedisUnavailable):
            refresh.delay(10)
    finally:
        store_server.resume()


def test_remembering_can_be_turned_off(
    make_store_app: Callable[..., Any], store_server: RedisServer
) -> None:
    refresh = unique_task(make_store_app(dedupe_remember_duplicates=0))
    remembered(refresh, 11)
    before = evalsha_calls(store_server)
    assert refresh.delay(11).deduplicated is True
    assert evalsha_calls(store_server) == before + 1


@pytest.mark.parametrize(
    ("refused", "options"),
    [
        # A Redis before 6, or a proxy that speaks RESP2 only (redis-py 8 asks for RESP3
        # by default: such a server needs protocol=2).
        ("HELLO", {"protocol": 2}),
        # A managed Redis that keeps CLIENT to itself.
        ("CLIENT", {}),
    ],
)
def test_a_server_that_cannot_track_keys_is_asked_every_time(
    redis_factory: RedisFactory,
    make_app: Callable[..., Any],
    broker: str,
    refused: str,
    options: dict[str, Any],
) -> None:
    server = redis_factory("--rename-command", refused, "")
    app = make_app(broker, dedupe_redis_url=server.url, dedupe_redis_options=options)
    refresh = unique_task(app)
    first = remembered(refresh, 12)
    before = evalsha_calls(server)
    answer = refresh.delay(12)
    assert (answer.deduplicated, answer.id) == (True, first.id)
    assert evalsha_calls(server) == before + 1


def test_a_user_whose_acl_allows_tracking_but_not_caching_is_asked_every_time(
    store_app: Any, store_server: RedisServer, make_app: Callable[..., Any], broker: str
) -> None:
    admin = redis.Redis.from_url(store_server.url, protocol=2)
    try:
        # (Redis 6.2 denies no single subcommand: all of CLIENT, then TRACKING back.)
        admin.execute_command(
            "ACL",
            "SETUSER",
            "producer",
            "on",
            "nopass",
            "~*",
            "&*",
            "+@all",
            "-client",
            "+client|tracking",
        )
    finally:
        admin.close()
    url = store_server.url.replace("redis://", "redis://producer@", 1)
    refresh = unique_task(make_app(broker, dedupe_redis_url=url))
    first = remembered(refresh, 16)
    before = evalsha_calls(store_server)
    answer = refresh.delay(16)
    assert (answer.deduplicated, answer.id) == (True, first.id)
    assert evalsha_calls(store_server) == before + 1


@pytest.fixture
def forked() -> Callable[[Callable[[], bool]], bool]:
    """Run a check in a forked child: its verdict."""

    def run(check: Callable[[], bool]) -> bool:
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            code = 1
            try:
                code = 0 if check() else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status) == 0

    return run


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_a_forked_child_does_not_answer_from_its_parents_memory(
    store_app: Any, forked: Callable[[Callable[[], bool]], bool]
) -> None:
    refresh = unique_task(store_app)
    remembered(refresh, 13)
    _, keys = keys_of_call(refresh, (13,), None, None, {})
    store = runtime_of(store_app).store
    assert store.remembered(keys) is not None
    assert forked(lambda: store.remembered(keys) is None)


def test_a_change_pushed_behind_an_unread_reply_is_not_missed(
    store_app: Any, store_server: RedisServer
) -> None:
    refresh = unique_task(store_app)
    remembered(refresh, 14)
    # An accepted call of a task of mostly duplicates confirms its record without waiting
    # for the reply: the push below comes behind that reply.
    assert refresh.delay(15).deduplicated is False
    holder = dedupe.lookup(refresh, (14,))
    assert holder is not None
    other = redis.Redis.from_url(store_server.url, protocol=2)
    try:
        assert other.delete(holder.key) == 1
    finally:
        other.close()
    assert refresh.delay(14).deduplicated is False


def test_a_thread_remembers_a_bounded_number_of_answers(
    store_app: Any, store_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dedupe.store.remembered.MOST_REMEMBERED", 3)
    refresh = unique_task(store_app)
    for x in range(20, 25):
        remembered(refresh, x)
    before = evalsha_calls(store_server)
    for x in range(20, 23):
        assert refresh.delay(x).deduplicated is True
    assert evalsha_calls(store_server) > before  # the oldest answers were dropped


def test_call_deduplicated_says_whether_the_answer_was_remembered(store_app: Any) -> None:
    refresh = unique_task(store_app)
    refresh.delay(17)
    mostly_duplicates(refresh)
    said: list[bool] = []

    def deduplicated(remembered: bool, **_: Any) -> None:
        said.append(remembered)

    events.call_deduplicated.connect(deduplicated, weak=False)
    try:
        refresh.delay(17)  # asks Redis
        refresh.delay(17)  # asks Redis, and remembers
        refresh.delay(17)  # answered from memory
    finally:
        events.call_deduplicated.disconnect(deduplicated)
    assert said == [False, False, True]


class HalvingProxy(RedisProxy):
    """Once ``halve`` is set, hands each of the server's writes to the client in two halves,
    the second ``pause`` seconds after the first: a message cut across two segments, as a
    network may deliver it."""

    def __init__(self, target_port: int, pause: float) -> None:
        super().__init__(target_port)
        self.pause, self.halve = pause, False

    def deliver(self, sink: socket.socket, data: bytes) -> None:
        if self.halve and len(data) > 1:
            sink.sendall(data[: len(data) // 2])
            time.sleep(self.pause)
            data = data[len(data) // 2 :]
        sink.sendall(data)


def test_a_change_pushed_in_two_segments_is_waited_for(
    make_app: Callable[..., Any], broker: str, store_server: RedisServer
) -> None:
    proxy = HalvingProxy(store_server.port, pause=1.0)
    try:
        refresh = unique_task(make_app(broker, dedupe_redis_url=proxy.url))
        remembered(refresh, 18)
        holder = dedupe.lookup(refresh, (18,))
        assert holder is not None
        proxy.halve = True
        other = redis.Redis.from_url(store_server.url, protocol=2)
        try:
            assert other.delete(holder.key) == 1
        finally:
            other.close()
        time.sleep(0.3)  # the push's first half is here, its second a second away
        assert refresh.delay(18).deduplicated is False
    finally:
        proxy.close()


def test_pushes_waiting_on_the_connection_are_read_before_a_remembered_answer_is_given(
    store_app: Any, store_server: RedisServer
) -> None:
    refresh = unique_task(store_app)
    first = remembered(refresh, 19)
    remembered(refresh, 20)
    other_key, this_key = dedupe.lookup(refresh, (20,)), dedupe.lookup(refresh, (19,))
    assert other_key is not None
    assert this_key is not None
    other = redis.Redis.from_url(store_server.url, protocol=2)
    try:
        assert other.delete(other_key.key) == 1  # a push for the other key comes
        time.sleep(0.1)
        before = evalsha_calls(store_server)
        answer = refresh.delay(19)
        assert (answer.deduplicated, answer.id) == (True, first.id)
        assert evalsha_calls(store_server) == before  # read, and not about this key
        assert other.delete(this_key.key) == 1  # a push for this key comes
        time.sleep(0.1)
        assert refresh.delay(19).deduplicated is False  # read: the call asked, and won
        assert evalsha_calls(store_server) > before
    finally:
        other.close()


def test_a_call_owed_an_earlier_reply_on_a_frozen_store_waits_out_one_retry_cycle_not_two(
    make_store_app: Callable[..., Any], store_server: RedisServer
) -> None:
    app = make_store_app(
        dedupe_redis_options={"socket_timeout": 0.2, "socket_connect_timeout": 0.2},
        dedupe_on_redis_error="raise",
    )
    refresh = unique_task(app)
    remembered(refresh, 21)
    # An accepted call of a task of mostly duplicates confirms without waiting: its reply
    # is owed when the next call comes.
    assert refresh.delay(22).deduplicated is False
    stats = redis.Redis.from_url(store_server.url, protocol=2)
    try:
        before = stats.info("stats")["total_connections_received"]
        store_server.pause()
        try:
            with pytest.raises(dedupe.RedisUnavailable):
                refresh.delay(21)
        finally:
            store_server.resume()
        # The first try on the call's open connection, then one per retry (2): no wait
        # before them for the remembered answer.
        assert stats.info("stats")["total_connections_received"] - before == 2
    finally:
        stats.close()


def test_a_busy_store_refuses_tracking_for_that_call_only(
    store_app: Any, store_server: RedisServer
) -> None:
    refresh = unique_task(store_app)
    first = refresh.delay(23)
    mostly_duplicates(refresh)
    assert refresh.delay(23).deduplicated is True  # met held: its next duplicate is tracked
    admin = redis.Redis.from_url(store_server.url, protocol=2, socket_timeout=10)
    busy = redis.Redis.from_url(store_server.url, protocol=2, socket_timeout=10)

    def spin() -> None:
        with contextlib.suppress(redis.RedisError):
            busy.eval("while true do end", 0)  # until SCRIPT KILL

    try:
        admin.config_set("lua-time-limit", 50)  # (busy-reply-threshold's old name)
        spinning = threading.Thread(target=spin, daemon=True)
        spinning.start()
        time.sleep(0.3)
        with contextlib.suppress(dedupe.RedisUnavailable):
            refresh.delay(23)  # BUSY, to its CLIENT CACHING YES too
        admin.script_kill()
        spinning.join(5)
    finally:
        busy.close()
        admin.close()
    assert refresh.delay(23).deduplicated is True  # met held again, tracked
    answer = refresh.delay(23)  # from memory: tracking was not given up for good
    assert (answer.deduplicated, answer.id) == (True, first.id)
    assert answer.holder is not None
    before = evalsha_calls(store_server)
    assert refresh.delay(23).deduplicated is True
    assert evalsha_calls(store_server) == before


def test_a_killed_connection_under_a_retry_policy_that_retries_no_connection_error_answers(
    make_store_app: Callable[..., Any], store_server: RedisServer
) -> None:
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    app = make_store_app(
        dedupe_redis_options={
            "retry": Retry(NoBackoff(), 2, supported_errors=(redis.TimeoutError,))
        }
    )
    refresh = unique_task(app)
    first = remembered(refresh, 24)
    admin = redis.Redis.from_url(store_server.url, protocol=2)
    try:
        admin.client_kill_filter(_type="normal", skipme=True)
    finally:
        admin.close()
    answer = refresh.delay(24)
    assert (answer.deduplicated, answer.id) == (True, first.id)


def test_only_keys_met_held_before_are_tracked(store_app: Any, store_server: RedisServer) -> None:
    # Redis keeps a tracked key in its table until the key changes: accepted calls and a
    # key's first duplicate add nothing to it.
    refresh = unique_task(store_app)
    mostly_duplicates(refresh)
    for x in range(30, 40):
        assert refresh.delay(x).deduplicated is False
        assert refresh.delay(x).deduplicated is True
    assert tracked_keys(store_server) == 0
    assert refresh.delay(30).deduplicated is True
    # The key, and on a Redis broker the marker its store's enqueue reads
    # (dedupe.values.keys.alive_key).
    assert 1 <= tracked_keys(store_server) <= 2


def tracked_keys(server: RedisServer) -> int:
    client = redis.Redis.from_url(server.url, protocol=2)
    try:
        return int(client.info("stats")["tracking_total_keys"])
    finally:
        client.close()
