"""key_concurrency's line held in Redis (issue 41): a call over the limit waits in its key's
line with what publishes it, and the run that frees a slot hands it on; no message of a
waiting call goes round the broker, none reads RETRY, and a slot or place never outlives its
message by more than a lease. Real Redis, real prefork workers (killed where the test says)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from .helpers import WorkerProcess, wait_for
from .test_key_concurrency import most_at_once

pytestmark = [pytest.mark.slow]


@pytest.fixture
def queue(tag: str) -> str:
    return f"lines-{tag}"


@pytest.fixture(autouse=True)
def _forget_started(worker_app: Any) -> Iterator[None]:
    # A call handed a slot twice (its first lapsed) drops its later copies for unique_ttl:
    # forgotten here, for the shared workers' tests that find no key left.
    yield
    forget_started(worker_app)


def forget_started(worker_app: Any) -> None:
    client = redis.Redis.from_url(worker_app.STORE)
    for key in client.scan_iter(f"{worker_app.PREFIX}:*:started"):
        client.delete(key)
    client.close()


@pytest.fixture
def worker(worker_app: Any, queue: str) -> Iterator[WorkerProcess]:
    """One prefork worker of two processes on a queue of the test's own."""
    started = WorkerProcess(worker_app.app, {"DEDUPE_TEST_QUEUE": queue}, concurrency=2)
    started.start()
    yield started
    started.stop()


def test_waiting_calls_are_not_sent_again_and_never_read_retry(
    worker_app: Any, tag: str, queue: str, worker: WorkerProcess
) -> None:
    results = [
        worker_app.one_at_once.apply_async((tag, index, 0.5), queue=queue) for index in range(4)
    ]
    states: set[str] = set()
    deadline = time.monotonic() + 30
    while not all(result.ready() for result in results) and time.monotonic() < deadline:
        states.update(result.state for result in results)
        time.sleep(0.05)
    assert [result.get(timeout=1) for result in results] == list(range(4))
    assert "RETRY" not in states
    log = worker.tail()
    for result in results:
        assert f"{result.id}] waits its turn" not in log or log.count(result.id) < 8
    assert not re.search(r"sent again in .*" + re.escape(tag), log)
    assert "Retry in" not in log
    runs = worker_app.runlog(tag).runs()
    assert most_at_once(runs) == 1
    assert [run[0] for run in sorted(runs, key=lambda run: run[1])] == [r.id for r in results]


def test_a_limited_call_is_one_broker_message_whatever_the_backlog(
    worker_app: Any, tag: str, queue: str, worker: WorkerProcess
) -> None:
    client = redis.Redis.from_url(worker_app.REDIS)

    def pushes() -> int:
        stats = client.info("commandstats")
        return int(stats.get("cmdstat_lpush", {}).get("calls", 0)) + int(
            stats.get("cmdstat_rpush", {}).get("calls", 0)
        )

    # (The run log and the tasks' events are lists too: counted, and taken off.)
    before = pushes()
    results = [
        worker_app.one_at_once.apply_async((tag, index, 0.1), queue=queue) for index in range(10)
    ]
    assert [result.get(timeout=30) for result in results] == list(range(10))
    runlog_pushes = 2 * len(worker_app.runlog(tag).runs())  # (a start and an end each)
    assert pushes() - before - runlog_pushes == len(results)


def test_a_killed_workers_prefetched_message_does_not_stall_the_line_beyond_a_lease(
    worker_app: Any, tag: str, queue: str
) -> None:
    env = {"DEDUPE_TEST_QUEUE": queue}
    first = WorkerProcess(worker_app.app, env, concurrency=1)
    second = WorkerProcess(worker_app.app, env, concurrency=1)
    task = worker_app.two_early_acked
    first.start()
    try:
        running = task.apply_async((tag, 0, 60.0), queue=queue)
        wait_for(lambda: worker_app.runlog(tag).runs(), message="the first run started")
        prefetched = task.apply_async((tag, 1, 0.0), queue=queue)  # (handed the second slot)
        time.sleep(1.0)  # (the first worker, busy, prefetches it)
        assert first.process is not None
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait()
        later = task.apply_async((tag, 2, 0.0), queue=queue)
        second.start()
        # The lease is worker_app.LEASE (2 s): both slots lapse, the prefetched call is
        # handed on again, the later one runs.
        assert prefetched.get(timeout=15) == 1
        assert later.get(timeout=15) == 2
        assert not running.ready()
    finally:
        first.stop()
        second.stop()


_CALL = """
import os, sys
from celery import signals
sys.path.insert(0, {root!r})
from tests import worker_app

if {die!r}:
    @signals.before_task_publish.connect
    def die(**_):
        os._exit(3)  # (killed between its place and its publish)

print(worker_app.one_at_once.apply_async(({tag!r}, {index!r}, 0.0), queue={queue!r}).id)
"""


def _call(env: dict[str, str], tag: str, queue: str, index: int, *, die: bool) -> Any:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = _CALL.format(root=root, tag=tag, queue=queue, index=index, die=die)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, timeout=60, check=False, capture_output=True
    )


def test_an_interrupted_limited_call_does_not_hold_the_line_beyond_a_lease(
    worker_app: Any, tag: str, queue: str, rabbitmq_url: str
) -> None:
    # The broker apart from the dedup Redis: a call's place goes before its publish, in a
    # round trip of its own; this call dies between the two.
    dedupe_env = {
        "DEDUPE_TEST_BROKER": rabbitmq_url,
        "DEDUPE_TEST_REDIS": worker_app.REDIS,
        "DEDUPE_TEST_QUEUE": queue,
    }
    env = {**os.environ, **dedupe_env}
    assert _call(env, tag, queue, 0, die=True).returncode == 3
    pinger = Celery(
        "worker_app", broker=rabbitmq_url, backend=worker_app.REDIS, set_as_current=False
    )
    pinger.conf.task_default_queue = queue
    worker = WorkerProcess(pinger, dedupe_env)  # (pinged through RabbitMQ)
    worker.start()
    try:
        called = _call(env, tag, queue, 1, die=False)
        assert called.returncode == 0, called.stderr
        task_id = called.stdout.decode().split()[-1]
        assert worker_app.app.AsyncResult(task_id).get(timeout=20) == 1
    finally:
        worker.stop()
        with pinger.connection_for_write() as connection:
            connection.default_channel.queue_delete(queue)
        pinger.close()


def test_calls_by_send_task_wait_their_turn_like_any_other(
    worker_app: Any, tag: str, queue: str, worker: WorkerProcess
) -> None:
    name = worker_app.one_at_once.name
    results = [worker_app.app.send_task(name, (tag, index, 0.5), queue=queue) for index in range(3)]
    assert sorted(result.get(timeout=30) for result in results) == [0, 1, 2]
    assert most_at_once(worker_app.runlog(tag).runs()) == 1  # (two pool processes)


def test_a_call_not_yet_due_does_not_hold_back_the_calls_behind_it(
    worker_app: Any, tag: str, queue: str, worker: WorkerProcess
) -> None:
    # A call with a countdown takes no place at its call: it joins the line when it is due.
    later = worker_app.one_at_once.apply_async((tag, 0, 0.1), queue=queue, countdown=8)
    now = [
        worker_app.one_at_once.apply_async((tag, index, 0.1), queue=queue) for index in range(1, 4)
    ]
    assert [result.get(timeout=30) for result in [*now, later]] == [1, 2, 3, 0]
    runs = {task_id: (start, end) for task_id, start, end in worker_app.runlog(tag).runs()}
    assert max(runs[result.id][1] or 0.0 for result in now) < runs[later.id][0]
