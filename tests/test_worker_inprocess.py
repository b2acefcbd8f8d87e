"""The worker side with in-process workers: claim, release, the execution guard."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import redis
from celery import Celery, signals
from celery.exceptions import Ignore, Reject, Retry, TaskRevokedError

import dedupe

from .conftest import RedisFactory, in_process_worker
from .helpers import Lines, RunLog, keys_with_prefix, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def postrun_states() -> Iterator[dict[str, str]]:
    """The final state of every run in this process, by task id (IGNORED for a skip)."""
    states: dict[str, str] = {}

    def record(task_id: str = "", state: str = "", **_: Any) -> None:
        states[task_id] = state

    signals.task_postrun.connect(record, weak=False)
    yield states
    signals.task_postrun.disconnect(record)


@pytest.fixture
def gate() -> threading.Event:
    """Holds a task inside its run until the test opens it."""
    return threading.Event()


@pytest.fixture
def gated(app: Celery, runlog: RunLog, gate: threading.Event) -> Any:
    """A unique task that logs its run and stays in it until ``gate`` opens; returns its id."""

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, bind=True)
    def sync(self: Any, x: int) -> str:
        runlog.started(self.request.id)
        gate.wait(10)
        runlog.ended(self.request.id)
        return str(self.request.id)

    return sync


def test_the_key_is_freed_when_the_task_succeeds(app: Celery, no_keys_left: Any) -> None:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def add(x: int, y: int) -> int:
        return x + y

    with in_process_worker(app):
        assert add.delay(1, 2).get(timeout=10) == 3
        wait_for(lambda: dedupe.lookup(add, (1, 2)) is None, message="key freed")
        assert add.delay(1, 2).deduplicated is False
    no_keys_left(app)


def test_the_key_is_freed_when_the_task_fails(app: Celery) -> None:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def boom(x: int) -> None:
        raise ValueError(x)

    with in_process_worker(app):
        with pytest.raises(ValueError, match="1"):
            boom.delay(1).get(timeout=10)
        wait_for(lambda: dedupe.lookup(boom, (1,)) is None, message="key freed")


def test_a_running_task_holds_its_key_as_running_with_its_worker(
    app: Celery, gate: threading.Event
) -> None:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def hold(x: int) -> None:
        gate.wait(10)

    with in_process_worker(app):
        result = hold.delay(1)
        holder = wait_for(
            lambda: (h := dedupe.lookup(hold, (1,))) and h.state == "running" and h,
            message="running",
        )
        assert holder.task_id == result.id
        assert holder.worker is not None
        assert holder.worker.endswith(":" + str(__import__("os").getpid()))
        assert holder.ttl is not None
        assert holder.ttl <= 60
        gate.set()
        result.get(timeout=10)


def test_a_call_during_a_run_is_a_duplicate_of_the_run(app: Celery, gate: threading.Event) -> None:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def hold(x: int) -> None:
        gate.wait(10)

    with in_process_worker(app):
        first = hold.delay(1)
        wait_for(
            lambda: (h := dedupe.lookup(hold, (1,))) and h.state == "running", message="running"
        )
        during = hold.delay(1)
        assert during.deduplicated
        assert during.id == first.id
        assert during.holder is not None
        assert during.holder.state == "running"
        gate.set()
        first.get(timeout=10)


def test_until_started_accepts_a_call_during_a_run_and_runs_it_after(
    app: Celery, runlog: RunLog, gate: threading.Event
) -> None:
    @app.task(
        shared=False,
        base=dedupe.DedupeTask,
        unique=True,
        unique_until="started",
        on_running_countdown=0.2,
        bind=True,
    )
    def refresh(self: Any, x: int) -> None:
        runlog.started(self.request.id)
        gate.wait(10)
        time.sleep(0.3)
        runlog.ended(self.request.id)

    with in_process_worker(app, pool="threads", concurrency=2):
        first = refresh.delay(1)
        wait_for(lambda: runlog.runs(), message="first run")
        second = refresh.delay(1)
        third = refresh.delay(1)
        assert second.deduplicated is False
        assert second.id != first.id
        assert third.deduplicated is True
        assert third.id == second.id
        gate.set()
        first.get(timeout=10)
        second.get(timeout=10)
    (one, two) = runlog.runs()
    assert (one[0], two[0]) == (first.id, second.id)
    assert two[1] >= one[2]  # the call made during the first run ran after it


def test_until_window_a_call_after_the_run_ended_is_a_duplicate_within_the_window(
    app: Celery,
) -> None:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, unique_until="window")
    def remind(user: int) -> str:
        return f"reminded {user}"

    with in_process_worker(app):
        first = remind.apply_async((1,), unique_ttl=30)
        assert first.get(timeout=10) == "reminded 1"
        again = remind.delay(1)
    assert again.deduplicated is True
    assert again.id == first.id
    holder = dedupe.lookup(remind, (1,), unique_until="window")
    assert holder is not None
    assert holder.task_id == first.id
    assert holder.ttl is not None
    assert 20 < holder.ttl <= 30


def test_until_window_a_call_after_the_window_is_accepted(app: Celery) -> None:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, unique_until="window")
    def remind(user: int) -> None: ...

    with in_process_worker(app):
        first = remind.apply_async((2,), unique_ttl=1)
        first.get(timeout=10)
        wait_for(
            lambda: dedupe.lookup(remind, (2,), unique_until="window") is None,
            message="the window passed",
        )
        later = remind.delay(2)
        assert later.deduplicated is False
        later.get(timeout=10)


def test_until_window_runs_never_overlap_when_a_run_outlasts_its_window(
    app: Celery, runlog: RunLog, gate: threading.Event
) -> None:
    @app.task(
        shared=False,
        base=dedupe.DedupeTask,
        unique=True,
        unique_until="window",
        unique_ttl=0.5,
        on_running_countdown=0.2,
        bind=True,
    )
    def remind(self: Any, user: int) -> None:
        runlog.started(self.request.id)
        gate.wait(10)
        runlog.ended(self.request.id)

    with in_process_worker(app, pool="threads", concurrency=2):
        first = remind.delay(3)
        wait_for(lambda: runlog.runs(), message="first run")
        wait_for(
            lambda: not remind.delay(3).deduplicated, message="a call after the window accepted"
        )
        time.sleep(0.5)  # the second message meets the running first one, and waits
        gate.set()
        first.get(timeout=10)
        wait_for(lambda: len(runlog.runs()) == 2, message="the second run")
    assert runlog.overlaps() == []


def test_an_exclusive_task_queues_every_call_but_never_overlaps_runs(
    app: Celery, runlog: RunLog, queue_length: Any
) -> None:
    @app.task(
        shared=False,
        base=dedupe.DedupeTask,
        exclusive=True,
        on_running="retry",
        on_running_countdown=0.1,
        bind=True,
    )
    def nightly(self: Any, x: int) -> None:
        runlog.started(self.request.id)
        time.sleep(0.3)
        runlog.ended(self.request.id)

    results = [nightly.delay(1) for _ in range(3)]
    assert queue_length(app) == 3
    with in_process_worker(app, pool="threads", concurrency=3):
        for result in results:
            result.get(timeout=20)
    assert len(runlog.runs()) == 3
    assert runlog.overlaps() == []


def test_a_message_that_bypassed_the_producer_is_skipped_while_a_run_holds_the_key(
    app: Celery,
    gated: Any,
    runlog: RunLog,
    gate: threading.Event,
    redis_client: redis.Redis,
    postrun_states: dict[str, str],
) -> None:
    with in_process_worker(app, pool="threads", concurrency=2):
        first = gated.delay(1)
        wait_for(lambda: runlog.runs(), message="first run")
        holder_before = redis_client.get(first.keys.call)
        bypass = app.send_task(gated.name, args=(1,))
        wait_for(lambda: postrun_states.get(bypass.id) == "IGNORED", message="bypass skipped")
        assert redis_client.get(first.keys.call) == holder_before  # untouched
        gate.set()
        first.get(timeout=10)
    assert [run[0] for run in runlog.runs()] == [first.id]


def test_a_skipped_run_ends_revoked_naming_its_holder_so_get_never_hangs(
    app: Celery, gated: Any, runlog: RunLog, gate: threading.Event
) -> None:
    with in_process_worker(app, pool="threads", concurrency=2):
        first = gated.delay(2)
        wait_for(lambda: runlog.runs(), message="first run")
        bypass = app.send_task(gated.name, args=(2,))
        with pytest.raises(TaskRevokedError, match=f"skipped: .*{first.id}.* is running"):
            bypass.get(timeout=10)
        assert bypass.state == "REVOKED"
        gate.set()
        first.get(timeout=10)


def test_an_exclusive_tasks_call_made_during_a_run_waits_its_turn(
    app: Celery, runlog: RunLog, gate: threading.Event
) -> None:
    @app.task(shared=False, base=dedupe.DedupeTask, exclusive=True, bind=True)
    def nightly(self: Any, x: int) -> str:
        runlog.started(self.request.id)
        gate.wait(10)
        runlog.ended(self.request.id)
        return str(self.request.id)

    with in_process_worker(app, pool="threads", concurrency=2):
        first = nightly.delay(1)
        wait_for(lambda: runlog.runs(), message="first run")
        second = nightly.delay(1)
        time.sleep(0.5)  # it meets the running first one
        gate.set()
        assert first.get(timeout=10) == first.id
        assert second.get(timeout=20) == second.id
    assert [run[0] for run in runlog.runs()] == [first.id, second.id]
    assert runlog.overlaps() == []


def test_a_bypass_that_starts_while_a_call_is_queued_is_skipped_and_the_call_runs(
    app: Celery,
    gated: Any,
    runlog: RunLog,
    gate: threading.Event,
    redis_client: redis.Redis,
    postrun_states: dict[str, str],
) -> None:
    with in_process_worker(app, pool="threads", concurrency=2):
        # accepted: its id is the holder's; still queued when the record is read again
        queued = gated.apply_async((1,), countdown=4)
        duplicate = gated.delay(1)
        assert duplicate.deduplicated
        holder_before = redis_client.get(queued.keys.call)
        bypass = app.send_task(gated.name, args=(1,))
        wait_for(lambda: postrun_states.get(bypass.id) == "IGNORED", message="bypass skipped")
        assert redis_client.get(queued.keys.call) == holder_before  # untouched
        gate.set()
        # Every caller answered with the queued call's id gets its result.
        assert duplicate.get(timeout=10) == queued.id
    assert [run[0] for run in runlog.runs()] == [queued.id]


def test_an_accepted_message_that_meets_another_run_waits_for_it_and_is_never_skipped(
    app: Celery, gated: Any, runlog: RunLog, gate: threading.Event, postrun_states: dict[str, str]
) -> None:
    with in_process_worker(app, pool="threads", concurrency=2):
        first = gated.apply_async((1,), countdown=1)
        # Its record is lost while it waits (expired, evicted, cleared by hand): the next
        # call is accepted and starts first, so the first message meets a live run.
        assert dedupe.clear(gated, (1,))
        second = gated.delay(1)
        assert not second.deduplicated
        wait_for(lambda: postrun_states.get(first.id) == "RETRY", message="first waits")
        gate.set()
        assert second.get(timeout=10) == second.id
        assert first.get(timeout=15) == first.id
    assert [run[0] for run in runlog.runs()] == [second.id, first.id]
    assert runlog.overlaps() == []
    assert "IGNORED" not in postrun_states.values()


def test_a_retry_keeps_the_key_until_the_run_that_succeeds(app: Celery) -> None:
    attempts: list[str] = []

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, bind=True, max_retries=3)
    def flaky(self: Any, x: int) -> int:
        attempts.append(self.request.id)
        if len(attempts) < 3:
            during = flaky.delay(x)
            assert during.deduplicated
            assert during.id == self.request.id
            raise self.retry(countdown=0.2)
        return x

    with in_process_worker(app):
        result = flaky.delay(5)
        assert result.get(timeout=20) == 5
        wait_for(lambda: dedupe.lookup(flaky, (5,)) is None, message="key freed")
    assert attempts == [result.id] * 3


def test_a_retry_goes_back_to_queued_with_a_ttl_covering_its_countdown(app: Celery) -> None:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, bind=True, unique_ttl=30)
    def later(self: Any, x: int) -> None:
        if self.request.retries == 0:
            raise self.retry(countdown=100)

    with in_process_worker(app):
        result = later.delay(1)
        holder = wait_for(
            lambda: (h := dedupe.lookup(later, (1,))) and h.state == "queued" and h.eta and h,
            message="requeued",
        )
        assert holder.task_id == result.id
        assert holder.ttl is not None
        assert 125 < holder.ttl <= 130
        result.revoke()


@pytest.mark.parametrize(
    "exception", [Ignore(), Reject("no", requeue=False)], ids=["ignore", "reject"]
)
def test_ignore_and_reject_free_the_key(app: Celery, exception: Exception) -> None:
    ran = threading.Event()

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def quit_early(x: int) -> None:
        ran.set()
        raise exception

    with in_process_worker(app):
        quit_early.delay(1)
        assert ran.wait(10)
        wait_for(lambda: dedupe.lookup(quit_early, (1,)) is None, message="key freed")


def test_a_plain_task_sent_through_the_guard_is_claimed_and_freed(app: Celery) -> None:
    @app.task(shared=False)
    def plain(x: int) -> int:
        return x

    with in_process_worker(app):
        result = dedupe.apply_async(plain, (3,))
        assert result.get(timeout=10) == 3
        wait_for(lambda: dedupe.lookup(plain, (3,)) is None, message="key freed")


def test_worker_side_keys_use_the_header_not_the_arguments(
    app: Celery, redis_client: redis.Redis
) -> None:
    seen: list[Any] = []

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, bind=True)
    def nested(self: Any, payload: Any) -> None:
        seen.append(dedupe.lookup(nested, (payload,)))

    with in_process_worker(app):
        # The JSON round trip turns tuples into lists; the key must not change with it.
        result = nested.delay(((1, 2), {"a": (3,)}))
        result.get(timeout=10)
        assert seen[0] is not None
        assert seen[0].task_id == result.id
        wait_for(
            lambda: keys_with_prefix(redis_client, app.conf.dedupe_key_prefix) == [],
            message="key freed",
        )


def test_revoking_a_running_task_through_its_result_keeps_the_key_until_the_run_ends(
    app: Celery, gate: threading.Event
) -> None:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def hold(x: int) -> None:
        gate.wait(10)

    with in_process_worker(app):
        first = hold.delay(1)
        wait_for(
            lambda: (h := dedupe.lookup(hold, (1,))) and h.state == "running", message="running"
        )
        first.revoke()  # no terminate: the run goes on, and so must its hold on the key
        during = hold.delay(1)
        assert during.deduplicated
        assert during.id == first.id
        gate.set()
        wait_for(lambda: dedupe.lookup(hold, (1,)) is None, message="freed when the run ends")


def test_a_plain_tasks_retry_keeps_its_key_and_frees_it_at_the_end(
    app: Celery, redis_client: redis.Redis
) -> None:
    # The retry message may start on another thread before the first run has ended: the
    # key must already be back to queued by then, or it is left behind for an hour.
    @app.task(shared=False, bind=True)
    def again(self: Any, x: int) -> int:
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        return x

    def slow_retry_bookkeeping(**_: Any) -> None:
        # Widens the gap between the retry's publish and the end of the first run, as a
        # slow result backend would: the retry message starts inside it.
        time.sleep(0.3)

    signals.task_retry.connect(slow_retry_bookkeeping, weak=False)
    try:
        with in_process_worker(app, pool="threads", concurrency=2):
            results = [dedupe.apply_async(again, (x,)) for x in range(3)]
            assert [result.get(timeout=20) for result in results] == list(range(3))
            wait_for(
                lambda: keys_with_prefix(redis_client, app.conf.dedupe_key_prefix) == [],
                timeout=10,
                message="no key left behind",
            )
    finally:
        signals.task_retry.disconnect(slow_retry_bookkeeping)


def test_a_retry_keeps_the_key_its_call_was_made_with(
    app: Celery, redis_client: redis.Redis
) -> None:
    # Call-level options decide the key: a retry must carry it, not recompute it without them.
    seen: list[Any] = []

    @app.task(shared=False, base=dedupe.DedupeTask, bind=True)
    def report(self: Any, day: str, verbose: bool) -> str:
        if self.request.retries == 0:
            # Long enough for the test's look at the requeued key and its call meanwhile.
            raise self.retry(countdown=3)
        seen.append(dedupe.lookup(report, (day, not verbose), unique_on=("day",)))
        return day

    with in_process_worker(app):
        first = report.apply_async_unique(("monday", True), unique_on=("day",))
        wait_for(
            lambda: (
                (h := dedupe.lookup(report, ("monday", False), unique_on=("day",)))
                and h.state == "queued"
                and h.eta
            ),
            message="requeued for the retry",
        )
        same = report.apply_async_unique(("monday", False), unique_on=("day",))
        assert same.deduplicated
        assert same.id == first.id
        assert first.get(timeout=10) == "monday"
        assert seen[0] is not None
        assert seen[0].task_id == first.id
        wait_for(
            lambda: keys_with_prefix(redis_client, app.conf.dedupe_key_prefix) == [],
            message="no key left behind",
        )


def test_a_retry_of_a_call_sent_by_name_keeps_its_key(
    app: Celery, make_app: Any, redis_client: redis.Redis
) -> None:
    # The producer does not import the task (raw-argument key); the worker does (it could
    # bind the arguments): the retry must keep the producer's key.
    @app.task(shared=False, base=dedupe.DedupeTask, bind=True, name="named.retrying")
    def retrying(self: Any, x: int) -> int:
        if self.request.retries == 0:
            raise self.retry(countdown=0.5)
        return x

    producer = _producer_without_tasks(app)
    with in_process_worker(app):
        first = dedupe.apply_async("named.retrying", args=(4,), app=producer)
        wait_for(
            lambda: (
                (h := dedupe.lookup("named.retrying", (4,), app=producer)) is not None and h.eta
            ),
            message="requeued under the producer's key",
        )
        assert first.get(timeout=10) == 4
        producer.close()
        wait_for(
            lambda: keys_with_prefix(redis_client, app.conf.dedupe_key_prefix) == [],
            message="no key left behind",
        )


def _producer_without_tasks(app: Celery) -> Celery:
    producer = Celery(
        "producer",
        broker=app.conf.broker_url,
        backend=app.conf.result_backend,
        set_as_current=False,
    )
    producer.conf.update(
        {
            key: app.conf[key]
            for key in ("task_default_queue", "dedupe_redis_url", "dedupe_key_prefix")
        }
    )
    dedupe.install(producer)
    return producer


def test_a_copy_of_a_running_task_id_waits_and_leaves_the_holder_untouched(
    app: Celery, gate: threading.Event, redis_client: redis.Redis, runlog: RunLog
) -> None:
    # A redelivered copy (visibility timeout, a reconnect) of a message still running.
    @app.task(
        shared=False, base=dedupe.DedupeTask, unique=True, bind=True, on_running_countdown=0.2
    )
    def hold(self: Any, x: int) -> None:
        runlog.started(self.request.id)
        gate.wait(10)
        runlog.ended(self.request.id)

    with in_process_worker(app, pool="threads", concurrency=2):
        first = hold.delay(1)
        wait_for(lambda: runlog.runs(), message="first run")
        before = redis_client.get(first.keys.call)
        headers = {"celery_dedupe": {"key": first.keys.call, "until": "finished", "ttl": 3600}}
        app.send_task(hold.name, args=(1,), task_id=first.id, headers=headers)
        time.sleep(0.6)  # the copy met the run, deferred, met it again...
        assert redis_client.get(first.keys.call) == before  # same run token, still running
        assert [run[0] for run in runlog.runs()] == [first.id]
        gate.set()
        wait_for(
            lambda: len(runlog.runs()) == 2 and all(run[2] for run in runlog.runs()),
            message="the copy ran after the first run ended",
        )
    one, two = runlog.runs()
    assert two[1] >= one[2]


def test_a_retry_with_new_arguments_frees_the_key_of_the_old_ones(
    app: Celery, redis_client: redis.Redis
) -> None:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, bind=True)
    def step(self: Any, x: int) -> int:
        if x < 2:
            raise self.retry(args=(x + 1,), countdown=0.1)
        return x

    with in_process_worker(app):
        result = step.delay(0)
        assert result.get(timeout=10) == 2
        wait_for(
            lambda: keys_with_prefix(redis_client, app.conf.dedupe_key_prefix) == [],
            message="no key of any of the arguments left",
        )


def test_a_requeued_reject_under_acks_late_keeps_the_key_queued_for_the_redelivery(
    app: Celery,
) -> None:
    seen: list[Any] = []

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, bind=True, acks_late=True)
    def picky(self: Any, x: int) -> str:
        if not self.request.delivery_info.get("redelivered") and not seen:
            raise Reject("not yet", requeue=True)
        return "done"

    def after_first_delivery(task_id: str = "", state: str = "", **_: Any) -> None:
        # Connected after dedupe's own handler: the key's state between the deliveries.
        if state == "REJECTED":
            seen.append(dedupe.lookup(picky, (1,)))

    signals.task_postrun.connect(after_first_delivery, weak=False)
    try:
        with in_process_worker(app):
            result = picky.delay(1)
            assert result.get(timeout=10) == "done"
    finally:
        signals.task_postrun.disconnect(after_first_delivery)
    assert seen[0] is not None
    assert (seen[0].task_id, seen[0].state) == (result.id, "queued")
    wait_for(lambda: dedupe.lookup(picky, (1,)) is None, message="freed after the redelivery")


def test_a_bare_retry_that_publishes_nothing_frees_the_key(app: Celery) -> None:
    ran = threading.Event()

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def marks_retry(x: int) -> None:
        ran.set()
        raise Retry()  # the state says RETRY, but no message will run it again

    with in_process_worker(app):
        marks_retry.delay(1)
        assert ran.wait(10)
        wait_for(lambda: dedupe.lookup(marks_retry, (1,)) is None, message="key freed")


def test_a_worker_whose_dedup_redis_is_down_still_runs_its_tasks(
    make_app: Any, redis_factory: RedisFactory
) -> None:
    dedup = redis_factory()
    app = make_app(dedupe_redis_url=dedup.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> int:
        return x

    result = job.delay(1)  # accepted while Redis was up
    dedup.stop()
    with in_process_worker(app):
        assert result.get(timeout=15) == 1


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_a_run_longer_than_its_lease_keeps_its_key_through_heartbeats(
    app: Celery, pool: str
) -> None:
    seen: list[Any] = []

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, unique_lease=0.6, bind=True)
    def long_run(self: Any, x: int) -> None:
        for _ in range(4):  # 2 s: more than three leases
            time.sleep(0.5)
            seen.append(dedupe.lookup(long_run, (x,)))

    with in_process_worker(app, pool=pool):
        long_run.delay(1).get(timeout=15)
    assert len(seen) == 4
    assert all(holder is not None and holder.state == "running" for holder in seen)
    wait_for(lambda: dedupe.lookup(long_run, (1,)) is None, message="freed at the end")


def test_replace_is_a_continuation_never_refused(app: Celery, queue_length: Any) -> None:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def finish(x: int) -> str:
        return f"finished {x}"

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, bind=True)
    def start(self: Any, x: int) -> None:
        raise self.replace(finish.s(x))

    queued_finish = finish.delay(9)  # the replacement's key is held by another call
    result = start.delay(9)
    with in_process_worker(app):
        # The replacement was published under start's id: waiting on it does not hang.
        assert result.get(timeout=15) == "finished 9"
        assert queued_finish.get(timeout=15) == "finished 9"
    wait_for(
        lambda: dedupe.lookup(start, (9,)) is None and dedupe.lookup(finish, (9,)) is None,
        message="every key freed",
    )


def test_replace_with_the_same_call_keeps_the_key_for_the_replacement(app: Celery) -> None:
    rounds: list[int] = []

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, bind=True)
    def again(self: Any, x: int) -> str:
        rounds.append(x)
        if len(rounds) == 1:
            raise self.replace(again.s(x))
        return "second round"

    with in_process_worker(app):
        result = again.delay(3)
        assert result.get(timeout=15) == "second round"
    assert rounds == [3, 3]
    wait_for(lambda: dedupe.lookup(again, (3,)) is None, message="freed at the end")


def test_a_dropped_duplicate_result_does_not_stop_the_holders_get(
    redis_app: Celery, gate: threading.Event
) -> None:
    # Every duplicate is a second result object of the holder's id; before Celery 5.7 a
    # dropped one stopped the result consumer for that id under another object's .get().
    @redis_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def gated(x: int) -> int:
        gate.wait(10)
        return x

    with in_process_worker(redis_app, pool="threads"):
        first = gated.delay(1)
        got: list[int] = []
        getter = threading.Thread(target=lambda: got.append(first.get(timeout=15)))
        getter.start()
        wait_for(
            lambda: any(first.id in waiting for waiting in first.backend._pending_results),
            message="the getter waits",
        )
        duplicate = gated.delay(1)
        assert duplicate.deduplicated
        del duplicate
        gc.collect()
        gate.set()
        getter.join(20)
    assert got == [1]


def test_a_duplicates_result_gets_the_holders_value_and_runs_its_callbacks(
    app: Celery, gate: threading.Event
) -> None:
    # A duplicate's result makes its on_ready promise on first use: .get() and .then() work.
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def gated(x: int) -> int:
        gate.wait(10)
        return x * 2

    with in_process_worker(app, pool="threads"):
        first = gated.delay(4)
        duplicates = [gated.delay(4), *gated.map_unique([(4,)])]
        assert all(result.deduplicated for result in duplicates)
        called: list[Any] = []
        duplicates[0].then(called.append)
        gate.set()
        assert [result.get(timeout=15) for result in duplicates] == [8, 8]
        assert first.get(timeout=15) == 8
    wait_for(lambda: called == [duplicates[0]], message="the callback")


def test_a_release_after_a_run_longer_than_the_servers_idle_timeout_is_not_lost(
    make_app: Any, redis_factory: RedisFactory
) -> None:
    # Redis (or a proxy) closes connections idle past its timeout: the run's own connection,
    # idle while the task works, is dead by the release. A release sent blind on it was lost,
    # and the finished run kept its key for a whole lease.
    dedup = redis_factory()
    redis.Redis.from_url(dedup.url).config_set("timeout", 1)
    app = make_app(dedupe_redis_url=dedup.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, unique_lease=60)
    def slow(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    with in_process_worker(app):
        assert slow.delay(0).get(timeout=15) == 0  # a first run: its release script is known
        assert slow.delay(2.5).get(timeout=15) == 2.5
        wait_for(lambda: dedupe.lookup(slow, (2.5,)) is None, timeout=5, message="key freed")


@pytest.mark.parametrize("fault", ["script flush", "restart from the AOF"])
def test_a_release_after_the_server_lost_its_scripts_and_connections_mid_run_lands(
    fault: str, make_app: Any, redis_factory: RedisFactory
) -> None:
    # The run's connection is dead (a restart) or the script cache empty (both after a
    # restart, the latter also after a failover or SCRIPT FLUSH) by the time the run ends.
    dedup = redis_factory("--appendonly", "yes", "--appendfsync", "always")
    app = make_app(dedupe_redis_url=dedup.url)
    started, finish = threading.Event(), threading.Event()

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, unique_lease=60)
    def gated(x: int) -> int:
        started.set()
        finish.wait(15)
        return x

    with in_process_worker(app):
        result = gated.delay(1)
        assert started.wait(15)
        if fault == "script flush":
            redis.Redis.from_url(dedup.url).script_flush()
        else:
            dedup.stop()
            dedup.start()
        holder = dedupe.lookup(gated, (1,))
        assert holder is not None
        assert holder.state == "running"  # (the AOF kept the running record)
        finish.set()
        assert result.get(timeout=15) == 1
        wait_for(lambda: dedupe.lookup(gated, (1,)) is None, timeout=5, message="key freed")


def test_a_worker_whose_app_was_never_installed_refuses_the_run_and_frees_its_key(
    redis_app: Celery,
) -> None:
    # The producer's app is installed; the worker's (same broker, queue and settings) is not.
    worker_app = Celery("uninstalled", set_as_current=False)
    worker_app.conf.update(redis_app.conf.changes)
    worker_app.conf.broker_url = redis_app.conf.broker_url
    worker_app.conf.result_backend = redis_app.conf.result_backend

    for app in (redis_app, worker_app):

        @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="jobs.uninstalled")
        def job(x: int) -> int:
            return x

    producer_job = redis_app.tasks["jobs.uninstalled"]
    result = producer_job.delay(1)
    assert dedupe.lookup(producer_job, (1,)) is not None
    with Lines("dedupe.worker") as log, in_process_worker(worker_app):
        # Said at start, before any run, naming the tasks:
        said = next(line for line in log.text.splitlines() if "is not installed" in line)
        assert "Celery app 'uninstalled', which has DedupeTask tasks (" in said
        assert "jobs.uninstalled" in said
        with pytest.raises(dedupe.NotInstalled, match=r"dedupe\.install\(app\)"):
            result.get(timeout=15)
    assert dedupe.lookup(producer_job, (1,)) is None
    assert f"jobs.uninstalled[{result.id}] is refused, and its key" in log.text


def test_not_installed_read_back_from_the_result_backend_says_its_message_once(
    redis_app: Celery,
) -> None:
    # A result backend rebuilds an error as its class called with its args: those must be
    # the constructor's (the app's name), not the message, or the message wraps itself.
    worker_app = Celery("uninstalled", set_as_current=False)
    worker_app.conf.update(redis_app.conf.changes)
    worker_app.conf.broker_url = redis_app.conf.broker_url
    worker_app.conf.result_backend = redis_app.conf.result_backend

    for app in (redis_app, worker_app):

        @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="jobs.uninstalled")
        def job(x: int) -> int:
            return x

    result = redis_app.tasks["jobs.uninstalled"].delay(1)
    with in_process_worker(worker_app), pytest.raises(dedupe.NotInstalled) as raised:
        result.get(timeout=15)
    assert raised.value.app_name == "uninstalled"
    assert str(raised.value) == (
        "celery-dedupe is not installed on Celery app 'uninstalled': call dedupe.install(app) "
        "once where the app is created (producers and workers alike)."
    )


def test_a_message_whose_record_was_lost_waits_behind_the_run_and_gets_the_key_next(
    app: Celery, gated: Any, gate: threading.Event, runlog: RunLog, redis_client: redis.Redis
) -> None:
    # A Redis restart lost the queued record of a message: a call made meanwhile was accepted
    # and runs. The message, deferred, takes its place behind that run; calls made while it
    # waits for its next try are its duplicates (they used to win the key before its next
    # try, again and again: the chaos run saw one message never run).
    lost = gated.apply_async((1,), countdown=1)
    assert lost.keys is not None
    redis_client.delete(lost.keys.call)
    with in_process_worker(app, pool="threads", concurrency=2):
        running = gated.delay(1)
        wait_for(
            lambda: (
                len(msgpack.unpackb(redis_client.get(lost.keys.call) or b"\x90", raw=True)) == 7
            ),
            timeout=10,
            message="the lost message waiting in the run's record",
        )
        assert gated.delay(1).id == running.id  # the run holds the key still
        gate.set()
        assert running.get(timeout=10) == running.id
        # (Its next try may come, run and end at any moment: the gate is open.)
        wait_for(
            lambda: (
                ((h := dedupe.lookup(gated, (1,))) is not None and h.task_id == lost.id)
                or lost.ready()
            ),
            timeout=10,
            message="the key given to the lost message",
        )
        call = gated.delay(1)
        # Its result is stored before its key is freed: not ready, the call met its key.
        if not lost.ready():
            assert call.id == lost.id  # a call now is its duplicate, not a new task
        assert lost.get(timeout=20) == lost.id
        if call.id != lost.id:
            call.get(timeout=20)  # made after the lost message's run: a new call
    assert runlog.overlaps() == []


def test_an_accepted_message_that_lost_its_record_runs_before_a_queued_call_which_goes_next(
    app: Celery, gated: Any, gate: threading.Event, runlog: RunLog, redis_client: redis.Redis
) -> None:
    # A Redis restart lost the queued record of an accepted message; a call made meanwhile
    # was accepted and waits in the queue. Both must run: the message runs when it comes
    # (it used to wait for a next try, and lose the key to every call made in between), and
    # the queued call waits in its run's record, the key going back to it at the end.
    lost = gated.apply_async((1,), countdown=1)
    assert lost.keys is not None
    redis_client.delete(lost.keys.call)
    queued = gated.apply_async((1,), countdown=3)
    assert not queued.deduplicated
    with in_process_worker(app, pool="threads", concurrency=2):
        wait_for(lambda: runlog.runs() != [], timeout=10, message="the lost message's run")
        assert gated.delay(1).id == lost.id  # its run holds the key
        gate.set()
        assert lost.get(timeout=10) == lost.id
        assert queued.get(timeout=15) == queued.id
    assert [run[0] for run in runlog.runs()] == [lost.id, queued.id]
    assert runlog.overlaps() == []
