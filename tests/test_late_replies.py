"""A reply that comes after the socket timeout: the scripts that are safe to run twice are sent
again; a publish, which pushes a message, never is (it may have run, and its key may be free
again by the time it is sent): its fate is reported as unknown instead."""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dedupe.errors import RedisUnavailable
from dedupe.store.commands.pushes import PendingPush
from dedupe.store.store import Store
from dedupe.values.keys import CallKeys
from dedupe.values.record import new_nonce, pack_provisional, pack_queued

from .conftest import RedisFactory
from .proxies import RedisProxy

TTL_MS = 60_000
#: The client's socket timeout, and how late the server's replies come once ``late`` is set.
TIMEOUT, LATE = 0.3, 0.8


class LateProxy(RedisProxy):
    """Hands the server's next ``late`` writes to the client ``LATE`` seconds after they came:
    a reply stalled on its way, as the client sees it (the server ran the command at once)."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.late = 0

    def deliver(self, sink: socket.socket, data: bytes) -> None:
        if self.late > 0:
            self.late -= 1
            time.sleep(LATE)
        sink.sendall(data)


@pytest.fixture
def server(redis_factory: RedisFactory) -> Any:
    return redis_factory()


@pytest.fixture
def proxy(server: Any) -> Iterator[LateProxy]:
    late = LateProxy(server.port)
    yield late
    late.close()


@pytest.fixture
def store(proxy: LateProxy) -> Iterator[Store]:
    client = redis.Redis(
        port=proxy.port, socket_timeout=TIMEOUT, retry=Retry(NoBackoff(), 2), protocol=2
    )
    yield Store(client, budget=10.0)
    client.close()


@pytest.fixture
def direct(server: Any) -> Iterator[redis.Redis]:
    client = redis.Redis(port=server.port)
    yield client
    client.close()


def _freed_once_written(direct: redis.Redis, key: str) -> threading.Thread:
    """Delete ``key`` as soon as it exists: the message's run, ended before the reply."""

    def free() -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not direct.delete(key):
            time.sleep(0.005)

    thread = threading.Thread(target=free, daemon=True)
    thread.start()
    return thread


def _push(number: int) -> PendingPush:
    keys = CallKeys.of(f"late:{{t:{number}}}", separate_run_lock=False)
    queued = pack_queued(f"task-{number}", time.time(), None, new_nonce())
    return PendingPush(keys, queued, TTL_MS, f"message-{number}", ["late-queue"])


def _warm(store: Store) -> None:
    # (The scripts known and the connection open, so that only the publish meets the delay.)
    warm = _push(999)
    store.push(warm)
    store.client.delete(warm.keys.call, "late-queue")


def test_a_publish_whose_reply_comes_late_is_never_sent_again(
    store: Store, proxy: LateProxy, direct: redis.Redis
) -> None:
    _warm(store)
    push = _push(1)
    proxy.late = 1
    freeing = _freed_once_written(direct, push.keys.call)
    with pytest.raises(RedisUnavailable):  # its fate unknown to the caller
        store.push(push)
    freeing.join()
    assert direct.llen("late-queue") == 1


def test_a_batch_whose_replies_come_late_is_never_sent_again(
    store: Store, proxy: LateProxy, direct: redis.Redis
) -> None:
    _warm(store)
    pushes = [_push(number) for number in (2, 3)]
    proxy.late = 1
    freeing = [_freed_once_written(direct, push.keys.call) for push in pushes]
    with pytest.raises(RedisUnavailable):
        store.publish_many(pushes)
    for thread in freeing:
        thread.join()
    assert direct.llen("late-queue") == 2


def test_an_enqueue_whose_reply_comes_late_is_sent_again_and_answers_as_the_first(
    store: Store, proxy: LateProxy
) -> None:
    # enqueue.lua answers its own resend (the key holds these very bytes) as accepted.
    _warm(store)
    keys = CallKeys.of("late:{t:enqueue}", separate_run_lock=False)
    record = pack_queued("task-enqueue", time.time(), None, new_nonce())
    proxy.late = 1
    assert store.enqueue(keys, record, TTL_MS) is None


def _taken_once(direct: redis.Redis, key: str, done: Callable[[bytes | None], bool]) -> Any:
    """Once ``key``'s value satisfies ``done`` (the first sending applied), another call
    takes the key: what a command sent again must leave alone. Returns (thread, record)."""
    record = pack_queued("task-other", time.time(), None, new_nonce())

    def take() -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not done(direct.get(key)):
            time.sleep(0.002)
        direct.set(key, record, px=TTL_MS)

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread, record


def _warm_all(store: Store) -> None:
    # (Every script known to the server: a late NOSCRIPT would mean nothing ran at first.)
    _warm(store)
    keys = CallKeys.of("late:{t:warm}", separate_run_lock=False)
    _held(store, keys, "task-warm")
    store.claim(keys, "task-warm", "tok0", TTL_MS, "host", 1, int(time.time()))
    store.release(keys, "task-warm", "tok0")
    store.confirm(keys, b"absent", b"absent", TTL_MS)
    store.cancel(keys, "task-warm")


def _sent_again_beside(
    direct: redis.Redis,
    proxy: LateProxy,
    key: str,
    applied: Callable[[bytes | None], bool],
    send: Callable[[], Any],
) -> Any:
    """``send()`` with its reply late, so that it is sent again after another call took the
    key (once the first sending was ``applied``): its answer; the other call's record must
    be the key's still."""
    taking, other = _taken_once(direct, key, applied)
    proxy.late = 1
    answer = send()
    taking.join()
    assert direct.get(key) == other
    return answer


def _held(store: Store, keys: CallKeys, task_id: str) -> None:
    store.enqueue(keys, pack_queued(task_id, time.time(), None, new_nonce()), TTL_MS)


def test_a_claim_whose_reply_comes_late_is_sent_again_and_holds_one_run(
    store: Store, proxy: LateProxy, direct: redis.Redis
) -> None:
    _warm_all(store)
    keys = CallKeys.of("late:{t:claim}", separate_run_lock=False)
    _held(store, keys, "task-claim")
    proxy.late = 1
    assert store.claim(keys, "task-claim", "tok1", TTL_MS, "host", 1, int(time.time())) is None
    holder = store.lookup(keys)
    assert holder is not None
    assert (holder.task_id, holder.state) == ("task-claim", "running")
    assert store.release(keys, "task-claim", "tok1") == 1
    assert direct.exists(keys.call) == 0


def test_a_release_whose_reply_comes_late_is_sent_again_and_spares_the_next_holder(
    store: Store, proxy: LateProxy, direct: redis.Redis
) -> None:
    _warm_all(store)
    keys = CallKeys.of("late:{t:release}", separate_run_lock=False)
    _held(store, keys, "task-release")
    store.claim(keys, "task-release", "tok2", TTL_MS, "host", 1, int(time.time()))
    release = functools.partial(store.release, keys, "task-release", "tok2")
    _sent_again_beside(direct, proxy, keys.call, lambda value: value is None, release)


def test_a_confirm_whose_reply_comes_late_is_sent_again_and_spares_the_next_holder(
    store: Store, proxy: LateProxy, direct: redis.Redis
) -> None:
    _warm_all(store)
    keys = CallKeys.of("late:{t:confirm}", separate_run_lock=False)
    nonce = new_nonce()
    provisional = pack_provisional("task-confirm", nonce)
    queued = pack_queued("task-confirm", time.time(), None, nonce)
    direct.set(keys.call, provisional, px=TTL_MS)
    # Confirmed, then run and freed, then taken by another call, all before the reply came.
    confirm = functools.partial(store.confirm, keys, provisional, queued, TTL_MS)
    _sent_again_beside(direct, proxy, keys.call, lambda value: value == queued, confirm)


def test_a_cancel_whose_reply_comes_late_is_sent_again_and_spares_the_next_holder(
    store: Store, proxy: LateProxy, direct: redis.Redis
) -> None:
    _warm_all(store)
    keys = CallKeys.of("late:{t:cancel}", separate_run_lock=False)
    _held(store, keys, "task-cancel")
    cancel = lambda: store.cancel(keys, "task-cancel")  # noqa: E731
    # (The resend found another's record: nothing deleted.)
    assert (
        _sent_again_beside(direct, proxy, keys.call, lambda value: value is None, cancel) is False
    )
