"""A debounced or replacing message that the broker delivers again after its run ended (its
ack lost: a broker cut, a worker killed between the run's end and the ack) does not run
again: the run left a tombstone (its task id and retry count) that the delivery finds. A run
killed before its end has none: its message, delivered again, runs, with the burst's last
arguments; and a retry of a run is a run of its own.

The lost ack is injected for real on the Redis broker: the message's very payload is taken
from the queue before a worker gets it, and pushed back after its run, as kombu's restore
of an unacked message does. Real Redis, real prefork workers.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
import redis
from celery.result import AsyncResult

import dedupe

from .helpers import WorkerProcess, wait_for

pytestmark = [pytest.mark.slow]

#: The visibility timeout of the Redis-broker worker whose message is restored after a kill.
VISIBILITY = 8.0


def burst_in_a_parked_queue(task: Any, redis_client: redis.Redis, tag: str) -> tuple[str, bytes]:
    """Three calls of ``task`` (values 0, 1, 2): their one message parked in a queue no
    worker reads until the burst is over (a debounced message then runs when it comes, not
    sent again for a later deadline). Returns the burst's task id and the message's payload."""
    parked = f"parked-{tag}"
    results = [task.apply_async((tag, value), queue=parked) for value in range(3)]
    assert {result.id for result in results} == {results[0].id}
    time.sleep(1.5)  # (past a debounced burst's deadline: the last call's + 1 s)
    payload = redis_client.rpop(parked)
    assert isinstance(payload, bytes), "the burst's message is parked"
    return results[0].id, payload


def deliver(redis_client: redis.Redis, worker_app: Any, payload: bytes) -> None:
    redis_client.lpush(worker_app.QUEUE, payload)


def handled_again(worker: WorkerProcess, worker_app: Any, tag: str, task_id: str) -> None:
    """The second delivery of ``task_id``'s message was skipped, or ran."""
    wait_for(
        lambda: (
            f"{task_id}] skipped: its run ended already" in worker.tail()
            or len(worker_app.values_run(tag)) > 1
        ),
        message="the message delivered again was handled",
    )


def test_a_debounced_message_delivered_again_after_its_run_ended_does_not_run_again(
    prefork_worker: WorkerProcess, worker_app: Any, redis_client: redis.Redis, tag: str
) -> None:
    task_id, payload = burst_in_a_parked_queue(worker_app.debounced, redis_client, tag)
    deliver(redis_client, worker_app, payload)
    assert AsyncResult(task_id, app=worker_app.app).get(timeout=20) == 2
    deliver(redis_client, worker_app, payload)  # (its ack lost: the broker gives it back)
    handled_again(prefork_worker, worker_app, tag, task_id)
    assert worker_app.values_run(tag) == [(task_id, "2")]
    assert AsyncResult(task_id, app=worker_app.app).get(timeout=20) == 2


def test_a_replacing_message_delivered_again_after_its_run_ended_does_not_run_again(
    prefork_worker: WorkerProcess, worker_app: Any, redis_client: redis.Redis, tag: str
) -> None:
    task_id, payload = burst_in_a_parked_queue(worker_app.replaced, redis_client, tag)
    deliver(redis_client, worker_app, payload)
    assert AsyncResult(task_id, app=worker_app.app).get(timeout=20) == 2
    deliver(redis_client, worker_app, payload)
    handled_again(prefork_worker, worker_app, tag, task_id)
    assert worker_app.values_run(tag) == [(task_id, "2")]
    # (The skipped delivery claimed the key before it found the tombstone: it let it go.)
    wait_for(lambda: dedupe.lookup(worker_app.replaced, (tag, 0)) is None, message="key freed")


def test_a_replacing_message_delivered_again_during_a_later_run_is_skipped_not_put_in_line(
    prefork_worker: WorkerProcess, worker_app: Any, redis_client: redis.Redis, tag: str
) -> None:
    task_id, payload = burst_in_a_parked_queue(worker_app.replaced, redis_client, tag)
    deliver(redis_client, worker_app, payload)
    assert AsyncResult(task_id, app=worker_app.app).get(timeout=20) == 2
    later = worker_app.replaced.delay(tag, 5, 3.0)
    wait_for(lambda: len(worker_app.values_run(tag)) == 2, message="the later call's run")
    deliver(redis_client, worker_app, payload)  # (the later run holds the key)
    wait_for(
        lambda: (
            f"{task_id}] skipped: its run ended already" in prefork_worker.tail()
            or f"{task_id}] waits: " in prefork_worker.tail()
        ),
        message="the message delivered again was skipped or deferred",
    )
    # Deferred, it would wait in the later run's record: calls made meanwhile would be its
    # duplicates, answered with the ended run's id, their arguments left to nothing.
    assert f"{task_id}] waits: " not in prefork_worker.tail()
    assert later.get(timeout=20) == 5
    assert worker_app.values_run(tag) == [(task_id, "2"), (later.id, "5")]


def test_a_debounced_run_killed_before_its_end_runs_again_with_the_bursts_last_arguments(
    worker_app: Any, tag: str
) -> None:
    queue = f"debounced-late-{tag}"
    env = {"DEDUPE_TEST_QUEUE": queue, "DEDUPE_TEST_VISIBILITY": str(VISIBILITY)}
    task = worker_app.debounced_late
    first, second = WorkerProcess(worker_app.app, env), WorkerProcess(worker_app.app, env)
    first.start()
    try:
        results = [task.apply_async((tag, value), queue=queue) for value in range(3)]
        wait_for(lambda: worker_app.values_run(tag), message="the burst's run started")
        assert first.process is not None
        os.killpg(first.process.pid, signal.SIGKILL)  # (the whole worker: no ack, no end)
        first.process.wait()
        second.start()  # restores the message once the visibility timeout is over
        assert results[0].get(timeout=VISIBILITY + 20) == 2
    finally:
        first.stop()
        second.stop()
    assert worker_app.values_run(tag) == [(results[0].id, "2"), (results[0].id, "2")]


@pytest.mark.usefixtures("prefork_worker")
def test_a_retry_of_a_debounced_run_runs_with_the_bursts_last_arguments(
    worker_app: Any, tag: str
) -> None:
    results = [worker_app.debounced_retried.delay(tag, value) for value in range(3)]
    assert [result.get(timeout=20) for result in results] == [2] * 3
    assert worker_app.values_run(tag) == [(results[0].id, "2"), (results[0].id, "2")]
