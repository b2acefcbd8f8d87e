"""A resend is recognised by the call's nonce: redis-py sending a command again is accepted,
a second call is not, even with the same explicit task id at the same clock reading."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable

import pytest
import redis
from celery import Celery

from dedupe.store.replies import Push
from dedupe.store.store import Store
from dedupe.values.keys import call_keys
from dedupe.values.record import new_nonce, pack_provisional, pack_queued

from .helpers import ROOT

NOW = 1_800_000_000.0


@pytest.fixture
def store(redis_url: str) -> Store:
    return Store(redis.Redis.from_url(redis_url))


def test_enqueue_takes_the_same_call_sent_again(store: Store) -> None:
    keys = call_keys("nonce", "t", "resend", separate_run_lock=False)
    store.clear(keys)
    record = pack_provisional("fixed-id", 7)
    assert store.enqueue(keys, record, 10_000) is None
    assert store.enqueue(keys, record, 10_000) is None  # the same bytes: a resend


def test_enqueue_refuses_a_second_call_with_the_same_task_id_and_clock(store: Store) -> None:
    keys = call_keys("nonce", "t", "enqueue", separate_run_lock=False)
    store.clear(keys)
    assert store.enqueue(keys, pack_provisional("fixed-id", 7), 10_000) is None
    holder = store.enqueue(keys, pack_provisional("fixed-id", 8), 10_000)
    assert holder is not None
    assert holder.task_id == "fixed-id"


def test_publish_pushes_once_for_a_resend_and_never_for_a_second_call(store: Store) -> None:
    keys = call_keys("nonce", "t", "publish", separate_run_lock=False)
    store.clear(keys)
    store.client.delete("nonce-list")
    first = pack_queued("fixed-id", NOW, None, nonce=1)
    second = pack_queued("fixed-id", NOW, None, nonce=2)
    assert store.publish(keys, first, 10_000, "m1", ["nonce-list"]) is Push.PUSHED
    assert store.publish(keys, first, 10_000, "m1", ["nonce-list"]) is Push.RESENT
    refused = store.publish(keys, second, 10_000, "m2", ["nonce-list"])
    assert not isinstance(refused, Push)
    assert store.client.lrange("nonce-list", 0, -1) == [b"m1"]


_CALLER = textwrap.dedent(
    """
    import sys
    from celery import Celery
    import dedupe

    broker, prefix, queue, out, rounds = sys.argv[1:6]
    app = Celery("nonce", broker=broker, set_as_current=False)
    app.conf.update(dedupe_key_prefix=prefix, task_default_queue=queue)
    dedupe.install(app)

    @app.task(base=dedupe.DedupeTask, unique=True, name="nonce.job")
    def job(x): ...

    accepted = []
    for n in range(int(rounds)):
        if not job.apply_async((n,), task_id=f"fixed-{n}").deduplicated:
            accepted.append(str(n))
    with open(out, "w") as handle:
        handle.write(" ".join(accepted))
    """
)


@pytest.mark.slow
def test_two_processes_calling_with_one_explicit_task_id_are_never_both_accepted(
    make_app: Callable[..., Celery], redis_url: str, tmp_path: object
) -> None:
    app = make_app()
    prefix, queue = app.conf.dedupe_key_prefix, app.conf.task_default_queue
    rounds = 1500
    outs = [f"{tmp_path}/caller{index}" for index in range(2)]
    callers = [
        subprocess.Popen(
            [sys.executable, "-c", _CALLER, redis_url, prefix, queue, out, str(rounds)],
            cwd=ROOT,
        )
        for out in outs
    ]
    for caller in callers:
        assert caller.wait(120) == 0
    accepted: Counter[str] = Counter()
    for out in outs:
        with open(out) as handle:
            accepted.update(handle.read().split())
    assert set(accepted) == {str(n) for n in range(rounds)}
    assert max(accepted.values()) == 1
    assert redis.Redis.from_url(redis_url).llen(queue) == rounds


_SEEDED_CALLER = textwrap.dedent(
    """
    import random, sys
    from celery import Celery
    import dedupe

    broker, prefix, queue = sys.argv[1:4]
    app = Celery("nonce", broker=broker, set_as_current=False)
    app.conf.update(dedupe_key_prefix=prefix, task_default_queue=queue)
    dedupe.install(app)

    @app.task(base=dedupe.DedupeTask, unique=True, name="nonce.seeded")
    def job(x): ...

    random.seed(42)
    expected = random.getstate()
    assert not job.delay(1).deduplicated
    assert job.delay(1).deduplicated  # a duplicate draws its nonce too
    print("moved" if random.getstate() != expected else "alone")
    """
)


def test_a_call_leaves_the_random_modules_sequence_alone(
    make_app: Callable[..., Celery], redis_url: str
) -> None:
    """An application that seeds ``random`` gets the same draws whether or not it made calls
    in between (and hypothesis, which checks this, sees no strategy touching it). In a
    process of its own: no other thread there moves the sequence."""
    app = make_app()
    prefix, queue = app.conf.dedupe_key_prefix, app.conf.task_default_queue
    done = subprocess.run(
        [sys.executable, "-c", _SEEDED_CALLER, redis_url, prefix, queue],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["alone"]


def test_forked_producers_draw_different_nonces() -> None:
    read, write = os.pipe()
    children = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.write(write, f"{new_nonce()} {new_nonce()}\n".encode())
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    os.close(write)
    with os.fdopen(read) as lines:
        drawn = lines.read().split("\n")[:2]
    assert len(set(drawn)) == 2, drawn
