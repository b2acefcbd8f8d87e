"""The key's lifecycle on every path Celery takes, with real prefork workers and Redis.

One test per ending. After each test, no key may remain (unless the test says so): a key
left behind would refuse the next call for up to an hour.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded, WorkerLostError

import dedupe

from .helpers import (
    CELERY_REQUEUES_TIMEOUTS,
    CELERY_RETRIES_LOST_RUNS,
    WorkerProcess,
    fail_on_keys_left,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefork_worker")]


@pytest.fixture(autouse=True)
def no_key_left_behind(
    request: pytest.FixtureRequest, redis_client: redis.Redis, worker_app: Any
) -> Iterator[None]:
    yield
    if request.node.get_closest_marker("leaves_keys"):
        return
    fail_on_keys_left(redis_client, worker_app.PREFIX, within=3 * worker_app.LEASE + 3, shared=True)


def holder(task: Any, *args: Any) -> dedupe.Holder | None:
    return dedupe.lookup(task, args)


def wait_running(task: Any, *args: Any, timeout: float = 10) -> dedupe.Holder:
    found: dedupe.Holder = wait_for(
        lambda: (h := holder(task, *args)) is not None and h.state == "running" and h,
        timeout=timeout,
        message=f"{task.name}{args} running",
    )
    return found


def assert_freed_within_one_lease(worker_app: Any, task: Any, *args: Any) -> None:
    """Call right after killing the run: its key must be free within one lease."""
    killed_at = time.monotonic()
    wait_for(
        lambda: holder(task, *args) is None,
        timeout=worker_app.LEASE + 1,
        message="key free within one lease",
    )
    assert time.monotonic() - killed_at <= worker_app.LEASE + 1


def pid_of(redis_client: redis.Redis, tag: str) -> int:
    return int(wait_for(lambda: redis_client.get(f"pid:{tag}"), message="task pid"))


def test_success_frees_the_key(worker_app: Any, tag: str) -> None:
    assert worker_app.ok.delay(tag).get(timeout=10) == tag


def test_failure_frees_the_key(worker_app: Any, tag: str) -> None:
    with pytest.raises(ValueError, match=tag):
        worker_app.fail.delay(tag).get(timeout=10)


def test_a_retry_keeps_the_key_for_the_same_task_id_until_success(
    worker_app: Any, tag: str
) -> None:
    result = worker_app.retry_then_ok.delay(tag, 2, 0.5)
    after_the_end = []
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        current = holder(worker_app.retry_then_ok, tag, 2, 0.5)
        duplicate = worker_app.retry_then_ok.delay(tag, 2, 0.5)
        # The result is stored before the key is freed: a result not ready after both reads
        # means the key was held at both.
        if result.ready():
            if duplicate.id != result.id:
                after_the_end.append(duplicate)  # a call after the end is a new one
            break
        assert current is not None
        assert current.task_id == result.id
        assert duplicate.id == result.id
        time.sleep(0.05)
    assert result.get(timeout=10) == 2
    for call in after_the_end:
        call.get(timeout=10)
    assert [run[0] for run in worker_app.runlog(tag).runs()].count(result.id) == 3


def test_exhausted_retries_free_the_key(worker_app: Any, tag: str) -> None:
    result = worker_app.retry_forever.delay(tag)
    with pytest.raises(worker_app.retry_forever.MaxRetriesExceededError):
        result.get(timeout=10)
    assert len(worker_app.runlog(tag).runs()) == 3


@pytest.mark.parametrize(
    "name", ["retries_into_a_failed_publish", "replaces_into_a_failed_publish"]
)
def test_a_continuation_whose_publish_fails_frees_the_key(
    worker_app: Any, tag: str, name: str
) -> None:
    # A retry (Celery rejects the message, requeue=False) or a replacement by the same call
    # that could not be published: no run comes after this one, so its key must not be
    # handed to one, and the run's end frees it.
    task = getattr(worker_app, name)
    task.delay(tag)
    wait_for(lambda: [r for r in worker_app.runlog(tag).runs() if r[2]], message="run ended")
    wait_for(lambda: holder(task, tag) is None, timeout=5, message="the key freed at its end")
    assert task.delay(tag).deduplicated is False


def test_a_replacement_interrupted_after_its_publish_keeps_the_key(
    worker_app: Any, tag: str
) -> None:
    # What raised came after the replacement's message went out: the run's end hands the key
    # over to it, and it does not free it.
    task = worker_app.replaced_then_interrupted
    first = task.delay(tag)
    assert first.get(timeout=10) == "interrupted"
    assert holder(task, tag) is not None, "the replacement waits, and its key is free"
    assert task.delay(tag).deduplicated is True
    wait_for(lambda: len(worker_app.runlog(tag).runs()) == 2, message="the replacement ran")
    wait_for(lambda: holder(task, tag) is None, timeout=5, message="the key freed at its end")


def test_ignore_frees_the_key(worker_app: Any, tag: str) -> None:
    worker_app.ignore.delay(tag)
    wait_for(lambda: [r for r in worker_app.runlog(tag).runs() if r[2]], message="run ended")


def test_reject_without_requeue_frees_the_key(worker_app: Any, tag: str) -> None:
    worker_app.reject.delay(tag, False)
    wait_for(lambda: [r for r in worker_app.runlog(tag).runs() if r[2]], message="run ended")
    time.sleep(0.5)
    assert len(worker_app.runlog(tag).runs()) == 1


def test_reject_with_requeue_under_acks_late_keeps_the_key_for_the_redelivery(
    worker_app: Any, tag: str
) -> None:
    result = worker_app.reject.delay(tag, True)
    assert result.get(timeout=15) == "second delivery"
    runs = worker_app.runlog(tag).runs()
    assert [run[0] for run in runs] == [result.id, result.id]


def test_revoke_through_the_returned_result_frees_the_key_at_once(
    worker_app: Any, tag: str
) -> None:
    result = worker_app.sleepy.apply_async((tag, 0), countdown=30)
    result.revoke()
    assert holder(worker_app.sleepy, tag, 0) is None


def test_a_revoked_message_frees_its_key_when_the_worker_meets_it(
    worker_app: Any, tag: str
) -> None:
    result = worker_app.sleepy.apply_async((tag, 0), countdown=1)
    assert holder(worker_app.sleepy, tag, 0) is not None
    # Not through the result: the revoke frees nothing itself. The worker frees the key as
    # the revoke arrives if it holds the message already, else when it meets the message.
    worker_app.app.control.revoke(result.id)
    wait_for(lambda: holder(worker_app.sleepy, tag, 0) is None, timeout=10, message="freed")
    assert worker_app.runlog(tag).runs() == []


def test_an_expired_message_frees_its_key_and_never_runs(worker_app: Any, tag: str) -> None:
    worker_app.sleepy_long_lease.apply_async((tag, 0), countdown=1, expires=0.5)
    assert holder(worker_app.sleepy_long_lease, tag, 0) is not None
    wait_for(
        lambda: holder(worker_app.sleepy_long_lease, tag, 0) is None,
        timeout=10,
        message="freed when the worker meets the expired message",
    )
    assert worker_app.runlog(tag).runs() == []


def test_a_soft_time_limit_frees_the_key(worker_app: Any, tag: str) -> None:
    with pytest.raises(SoftTimeLimitExceeded):
        worker_app.soft_limited.delay(tag).get(timeout=10)


@pytest.mark.skipif(
    not CELERY_REQUEUES_TIMEOUTS, reason="this Celery drops a timed-out acks_late message"
)
def test_a_hard_time_limit_under_acks_late_keeps_the_key_for_the_redelivery(
    worker_app: Any, tag: str
) -> None:
    result = worker_app.hard_limited_redelivered.delay(tag)
    # (Celery stores the first delivery's TimeLimitExceeded before the redelivery runs.)
    runs = wait_for(
        lambda: [r for r in worker_app.runlog(tag).runs() if r[2]],
        timeout=20,
        message="the redelivery ran to its end",
    )
    assert [run[0] for run in worker_app.runlog(tag).runs()] == [result.id, result.id]
    assert len(runs) == 1  # the first delivery was killed: only the redelivery ended


@pytest.mark.skipif(
    CELERY_REQUEUES_TIMEOUTS, reason="this Celery requeues a timed-out acks_late message"
)
def test_a_hard_time_limit_under_acks_late_frees_the_key_when_celery_drops_the_message(
    worker_app: Any, tag: str
) -> None:
    task = worker_app.hard_limited_redelivered
    result = task.delay(tag)
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=15)
    wait_for(lambda: holder(task, tag) is None, timeout=5, message="freed by the parent")
    assert [run[0] for run in worker_app.runlog(tag).runs()] == [result.id]


def test_a_killed_child_frees_its_key_within_one_lease(
    worker_app: Any, tag: str, redis_client: redis.Redis
) -> None:
    result = worker_app.sleepy.delay(tag, 30)
    wait_running(worker_app.sleepy, tag, 30)
    os.kill(pid_of(redis_client, tag), signal.SIGKILL)
    assert_freed_within_one_lease(worker_app, worker_app.sleepy, tag, 30)
    with pytest.raises(WorkerLostError):
        result.get(timeout=10)


def test_the_main_process_frees_a_killed_childs_key_long_before_its_lease(
    worker_app: Any, tag: str, redis_client: redis.Redis
) -> None:
    task = worker_app.sleepy_long_lease
    result = task.delay(tag, 30)
    wait_running(task, tag, 30)
    os.kill(pid_of(redis_client, tag), signal.SIGKILL)
    # Celery's pool sees a child gone at its SIGCHLD, or else at its maintain_pool timer, every
    # 5 s (asynpool's timers; seen here: 5.0 s from the kill to "exited with signal 9"); the
    # key is freed right after that, far within the 30 s lease.
    wait_for(lambda: holder(task, tag, 30) is None, timeout=12, message="freed, lease is 30 s")
    with pytest.raises(WorkerLostError):
        result.get(timeout=10)


def test_a_limited_message_put_back_after_its_child_died_runs_again(
    worker_app: Any, tag: str
) -> None:
    # reject_on_worker_lost: Celery requeues the message and sends no task_failure. The dead
    # run's slot (its lease 30 s) must not make the redelivery a copy of a run, dropped.
    assert worker_app.limited_redelivered.delay(tag).get(timeout=20) == 2


def test_the_parent_sends_key_reclaimed_for_the_key_of_a_killed_child(
    worker_app: Any, tag: str, redis_client: redis.Redis
) -> None:
    task = worker_app.sleepy_long_lease
    result = task.delay(tag, 30)
    wait_running(task, tag, 30)
    os.kill(pid_of(redis_client, tag), signal.SIGKILL)
    reclaimed = wait_for(
        lambda: redis_client.lrange(f"reclaimed:{result.id}", 0, -1), message="key_reclaimed"
    )
    assert reclaimed == [result.keys.run.encode()]


def test_the_main_process_frees_the_key_of_a_run_past_its_hard_time_limit(
    worker_app: Any, tag: str
) -> None:
    task = worker_app.hard_limited_long_lease
    result = task.delay(tag)
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=10)
    wait_for(lambda: holder(task, tag) is None, timeout=5, message="freed, lease is 30 s")


def test_terminate_frees_the_key_long_before_its_lease(worker_app: Any, tag: str) -> None:
    task = worker_app.sleepy_long_lease
    result = task.delay(tag, 30)
    wait_running(task, tag, 30)
    result.revoke(terminate=True)
    wait_for(lambda: holder(task, tag, 30) is None, timeout=5, message="freed, lease is 30 s")


def test_the_parent_alone_frees_the_key_of_a_run_terminated_by_sigkill(
    worker_app: Any, tag: str
) -> None:
    # SIGKILL: the child runs no task_postrun; the 30 s lease cannot free it within the wait.
    task = worker_app.sleepy_long_lease
    result = task.delay(tag, 30)
    wait_running(task, tag, 30)
    result.revoke(terminate=True, signal="SIGKILL")
    wait_for(lambda: holder(task, tag, 30) is None, timeout=5, message="freed by the parent")


def test_the_parent_alone_frees_the_key_of_a_run_killed_at_its_hard_time_limit(
    worker_app: Any, tag: str
) -> None:
    task = worker_app.hard_limited_deaf
    result = task.delay(tag)
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=10)
    wait_for(lambda: holder(task, tag) is None, timeout=5, message="freed by the parent")


@pytest.mark.skipif(not CELERY_RETRIES_LOST_RUNS, reason="retry_on_worker_lost is Celery 5.7's")
def test_retry_on_worker_lost_keeps_the_key_for_the_retry(
    worker_app: Any, tag: str, redis_client: redis.Redis
) -> None:
    task = worker_app.lost_then_retried
    result = task.delay(tag)
    wait_running(task, tag)
    # The body's start, not only its claim: killed before the run log's first line, the
    # first run would leave no trace to count (its pid is written a moment before it).
    wait_for(lambda: worker_app.runlog(tag).runs(), message="the first run's start")
    os.kill(pid_of(redis_client, tag), signal.SIGKILL)
    # The main process re-sends it (same id): the key is the retry's, never free meanwhile.
    # The key is read before the run log: a retry that started (and may have ended, freeing
    # the key) between the two reads is the end of the watch, not a free key before it.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        current = holder(task, tag)
        if worker_app.runlog(tag).runs()[1:]:
            break
        assert current is not None
        assert current.task_id == result.id
        time.sleep(0.02)
    wait_for(
        lambda: [r for r in worker_app.runlog(tag).runs() if r[2]],
        timeout=10,
        message="the retry ran",
    )
    assert [run[0] for run in worker_app.runlog(tag).runs()] == [result.id, result.id]


def test_a_redelivered_message_claims_its_key_again_after_a_killed_child(
    worker_app: Any, tag: str, redis_client: redis.Redis
) -> None:
    task = worker_app.redelivered
    result = task.delay(tag, 30)
    first = wait_running(task, tag, 30)
    killed = pid_of(redis_client, tag)
    os.kill(killed, signal.SIGKILL)
    # The redelivery (same id) runs in another child, holding the key as its own run.
    again = wait_for(
        lambda: (
            (h := holder(task, tag, 30)) is not None
            and h.state == "running"
            and h.worker != first.worker
            and h
        ),
        timeout=worker_app.LEASE + 15,
        message="the redelivery running, holding the key",
    )
    assert again.task_id == result.id
    assert again.worker is not None
    assert not again.worker.endswith(f":{killed}")
    call = task.delay(tag, 30)
    # The result is stored before the key is freed: not ready, the call met the redelivery.
    if not result.ready():
        assert call.id == result.id  # a call meanwhile is its duplicate
    assert result.get(timeout=15) == tag
    if call.id != result.id:
        call.get(timeout=15)  # made after the redelivery's end: a new call
    runs = worker_app.runlog(tag).runs()
    assert [run[0] for run in runs if run[0] == result.id] == [result.id, result.id]
    assert first.task_id == result.id


def test_a_killed_worker_frees_its_key_within_one_lease(worker_app: Any, tag: str) -> None:
    # The whole worker dies (OOM killer, a lost node): no main process is left to free the
    # key, only the lease does.
    queue = f"lonely-{tag}"
    lonely = WorkerProcess(worker_app.app, env={"DEDUPE_TEST_QUEUE": queue})
    lonely.start()
    try:
        worker_app.sleepy.apply_async((tag, 30), queue=queue)
        wait_running(worker_app.sleepy, tag, 30)
        assert lonely.process is not None
        os.killpg(lonely.process.pid, signal.SIGKILL)
        assert_freed_within_one_lease(worker_app, worker_app.sleepy, tag, 30)
    finally:
        lonely.stop()


def test_the_heartbeat_keeps_a_run_longer_than_its_lease_holding_its_key(
    worker_app: Any, tag: str
) -> None:
    seconds = 3 * worker_app.LEASE
    result = worker_app.sleepy.delay(tag, seconds)
    first = wait_running(worker_app.sleepy, tag, seconds)
    while (current := holder(worker_app.sleepy, tag, seconds)) is not None:
        assert current.state == "running"
        assert current.worker == first.worker
        time.sleep(0.1)
    gone_at = time.time()
    # The key went when the run ended, not when a lease ran out mid-run.
    ((_, _, ended),) = worker_app.runlog(tag).runs()
    assert ended is not None
    assert ended <= gone_at
    assert result.get(timeout=5) == tag


def test_reject_with_requeue_without_acks_late_frees_the_key_of_the_lost_message(
    worker_app: Any, tag: str
) -> None:
    worker_app.reject_unacked.delay(tag)
    wait_for(lambda: [r for r in worker_app.runlog(tag).runs() if r[2]], message="run ended")
    wait_for(lambda: holder(worker_app.reject_unacked, tag) is None, message="key freed")
    time.sleep(0.5)
    assert len(worker_app.runlog(tag).runs()) == 1


def test_a_message_from_an_app_without_dedupe_installed_is_skipped_by_the_guard(
    worker_app: Any, tag: str, prefork_worker: WorkerProcess
) -> None:
    # A producer that never called dedupe.install (an old deploy, another service) sends
    # a plain Task of the same name: its message carries no key.
    from celery import Celery

    first = worker_app.sleepy.delay(tag, 2)
    wait_running(worker_app.sleepy, tag, 2)
    bare = Celery("bare", broker=worker_app.BROKER, set_as_current=False)
    try:

        @bare.task(name=worker_app.sleepy.name, shared=False)  # (shared: every later app gets it)
        def sleepy(tag: str, seconds: float) -> None: ...

        stray = sleepy.apply_async((tag, 2), queue=worker_app.QUEUE)
    finally:
        bare.close()
    wait_for(
        lambda: f"{stray.id}] skipped: {first.id} is running" in prefork_worker.tail(20000),
        message="skip logged with the holder's id",
    )
    first.get(timeout=10)
    assert [run[0] for run in worker_app.runlog(tag).runs()] == [first.id]


def watch_deletes(client: redis.Redis, key: str) -> Callable[[], int]:
    """Start counting the DELs of ``key`` (keyspace notifications); returns the counter."""
    client.config_set("notify-keyspace-events", "Kg")
    db = client.connection_pool.connection_kwargs.get("db", 0)
    watcher = client.pubsub()
    watcher.subscribe(f"__keyspace@{db}__:{key}")
    confirmed = watcher.get_message(timeout=5)
    assert confirmed is not None
    assert confirmed["type"] == "subscribe"  # counting from here on

    def count() -> int:
        events = []
        while (message := watcher.get_message(timeout=0.2)) is not None:
            events.append(message["data"])
        watcher.close()
        return events.count(b"del")

    return count


def test_a_paused_worker_past_its_lease_cannot_release_or_renew_the_new_holders_key(
    worker_app: Any, tag: str, redis_client: redis.Redis, prefork_worker: WorkerProcess
) -> None:
    sleepy = worker_app.sleepy

    def by_tag(seconds: float) -> dedupe.Holder | None:
        # (unique_on: the key is the tag's, whatever the seconds)
        return dedupe.lookup(sleepy, (tag, seconds), unique_on=("tag",))

    # The stale run outlives the pause (its sleep counts paused time too): resumed, it runs
    # on for seconds, so that its heartbeat meets the new holder before the run ends.
    stale = sleepy.apply_async((tag, worker_app.LEASE + 4), unique_on=("tag",))
    stale_holder = wait_for(
        lambda: (h := by_tag(0)) and h.state == "running" and h, message="stale run running"
    )
    pid = pid_of(redis_client, tag)
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: by_tag(0) is None, timeout=worker_app.LEASE + 2, message="lease lapsed")
        fresh = sleepy.apply_async((tag, worker_app.LEASE + 10), unique_on=("tag",))
        assert fresh.deduplicated is False
        running = wait_for(
            lambda: (h := by_tag(0)) and h.task_id == fresh.id and h.state == "running" and h,
            message="new holder running",
        )
        deletes = watch_deletes(redis_client, running.key)
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        stale.get(timeout=15)
        # The result is stored before the run's release: give a wrongful release time to
        # happen, and the new holder's heartbeat time to notice it.
        time.sleep(worker_app.LEASE)
        # The stale run's release was refused: nothing deleted the new holder's record (which
        # its heartbeat would have re-created).
        assert deletes() == 0
    finally:
        redis_client.config_set("notify-keyspace-events", "")
    current = by_tag(0)
    assert current is not None
    assert current.task_id == fresh.id
    log = prefork_worker.tail(50000)
    assert f"re-created {current.key}" not in log
    # The stale run's heartbeat found another owner and stopped renewing.
    assert f"lost the lease on {current.key} for task {stale.id}" in log
    assert stale_holder.task_id == stale.id != fresh.id
    fresh.get(timeout=20)


def test_a_send_task_that_bypassed_the_producer_is_skipped_by_the_guard(
    worker_app: Any, tag: str, prefork_worker: WorkerProcess
) -> None:
    first = worker_app.sleepy.delay(tag, 2)
    wait_running(worker_app.sleepy, tag, 2)
    bypass = worker_app.app.send_task(worker_app.sleepy.name, args=(tag, 2))
    wait_for(
        lambda: f"{bypass.id}] skipped: {first.id} is running" in prefork_worker.tail(20000),
        message="skip logged with the holder's id",
    )
    first.get(timeout=10)
    assert [run[0] for run in worker_app.runlog(tag).runs()] == [first.id]


def test_until_started_accepts_a_call_during_a_run_and_runs_it_after(
    worker_app: Any, tag: str
) -> None:
    task = worker_app.started_mode
    # (Each run lasts 3 s: the third call comes while the first runs, and the second waits.)
    first = task.delay(tag, 3)
    wait_for(lambda: worker_app.runlog(tag).runs(), message="first run started")
    second = task.delay(tag, 3)
    assert second.deduplicated is False
    assert second.id != first.id
    assert task.delay(tag, 3).id == second.id  # queued behind the run: a duplicate
    first.get(timeout=10)
    second.get(timeout=15)
    one, two = worker_app.runlog(tag).runs()
    assert two[1] >= one[2]


def test_a_terminate_with_a_signal_the_run_handles_frees_the_key_only_when_it_ended(
    worker_app: Any, tag: str
) -> None:
    task = worker_app.cleans_up_when_told_to_stop
    result = task.delay(tag, 2.0)
    wait_running(task, tag, 2.0)
    result.revoke(terminate=True, signal="SIGUSR1")
    time.sleep(1.0)  # the run is cleaning up
    still = holder(task, tag, 2.0)
    assert still is not None, "the key was freed while the run still cleaned up"
    assert still.state == "running"
    wait_for(lambda: holder(task, tag, 2.0) is None, timeout=10, message="freed at the end")
    ((_, _, ended),) = worker_app.runlog(tag).runs()
    assert ended is not None  # the run ended by itself, and only then was its key freed


def test_a_retry_sent_without_raising_starts_only_after_the_run_that_sent_it_ended(
    worker_app: Any, tag: str
) -> None:
    task = worker_app.retries_and_goes_on
    task.delay(tag, 3.0)
    runlog = worker_app.runlog(tag)
    wait_for(
        lambda: len(runs := runlog.runs()) == 2 and all(run[2] is not None for run in runs),
        timeout=20,
        message="the first try and its retry ended",
    )
    assert runlog.overlaps() == []
    wait_for(lambda: holder(task, tag, 3.0) is None, timeout=5, message="freed after the retry")
