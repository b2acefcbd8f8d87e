"""key_concurrency=N: at most N runs of one key at once across all workers; every call is
accepted and runs, in call order; a killed worker's slot is freed by its lease. Real Redis,
real prefork workers; the runs' start and end times are written by the tasks (RunLog)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import WorkerLostError
from kombu.exceptions import OperationalError

import dedupe
from dedupe.producer.guard import keys_of_call
from dedupe.store.commands.leases import Lease
from dedupe.store.replies import Renewal
from dedupe.store.store import Store
from dedupe.values.config import DedupeConfig
from dedupe.values.limits import come_back, limit_keys
from dedupe.values.options import resolve

from .helpers import FAILS_AT_ONCE, UNREACHABLE, WorkerProcess, keys_with_prefix, wait_for

pytestmark = [pytest.mark.slow]

_CONFIG = DedupeConfig(redis_url="")
#: The Redis broker's visibility timeout for the workers of the kill test: the killed
#: worker's unacked messages come back this long after their delivery.
VISIBILITY = 6


def most_at_once(runs: list[tuple[str, float, float | None]]) -> int:
    """The largest number of runs live at one instant."""
    edges = sorted(
        [(start, 1) for _, start, _ in runs]
        + [(end if end is not None else float("inf"), -1) for _, _, end in runs]
    )
    live = most = 0
    for _, step in edges:  # (an end sorts before a start at the same instant)
        live += step
        most = max(most, live)
    return most


@pytest.fixture
def workers(worker_app: Any, tag: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Workers of a queue of the test's own: ``(queue, [WorkerProcess, ...])``, as many and
    as large as the test's parameter says ``(workers, processes each)``; default one of four."""
    count, concurrency = getattr(request, "param", (1, 4))
    queue = f"limits-{tag}"
    env = {"DEDUPE_TEST_QUEUE": queue, "DEDUPE_TEST_VISIBILITY": str(VISIBILITY)}
    started = [WorkerProcess(worker_app.app, env, concurrency=concurrency) for _ in range(count)]
    try:
        for worker in started:
            worker.start()
        yield queue, started
    finally:
        for worker in started:
            worker.stop()


def six_calls(worker_app: Any, tag: str, queue: str, seconds: float = 1.0) -> list[Any]:
    return [
        worker_app.two_at_once.apply_async((tag, index, seconds), queue=queue) for index in range(6)
    ]


def test_every_call_is_accepted_with_a_task_id_of_its_own(
    worker_app: Any, tag: str, workers: Any
) -> None:
    results = six_calls(worker_app, tag, workers[0])
    assert [result.deduplicated for result in results] == [False] * 6
    assert len({result.id for result in results}) == 6
    assert [result.get(timeout=30) for result in results] == list(range(6))


def test_six_calls_all_run_never_more_than_two_at_once(
    worker_app: Any, tag: str, workers: Any
) -> None:
    results = six_calls(worker_app, tag, workers[0])
    for result in results:
        result.get(timeout=30)
    runs = worker_app.runlog(tag).runs()
    assert sorted(run[0] for run in runs) == sorted(result.id for result in results)
    assert most_at_once(runs) == 2  # (four pool processes: without the limit, four)


def overtaken(runs: list[tuple[str, float, float | None]], calls: list[str]) -> int:
    """The most earlier calls that had not started when a later call started. In call order
    with a limit of N, at most N - 1: N calls let in at once may start in any order."""
    start = {task_id: begun for task_id, begun, _ in runs}
    return max(
        sum(1 for earlier in calls[:index] if start[earlier] > start[task_id])
        for index, task_id in enumerate(calls)
    )


def test_runs_start_in_call_order(worker_app: Any, tag: str, workers: Any) -> None:
    results = six_calls(worker_app, tag, workers[0])
    for result in results:
        result.get(timeout=30)
    assert overtaken(worker_app.runlog(tag).runs(), [result.id for result in results]) <= 1


@pytest.mark.parametrize("workers", [(2, 2)], indirect=True, ids=["two workers"])
def test_two_workers_never_run_more_than_two_at_once(
    worker_app: Any, tag: str, workers: Any
) -> None:
    results = six_calls(worker_app, tag, workers[0])
    for result in results:
        result.get(timeout=30)
    runs = worker_app.runlog(tag).runs()
    assert len(runs) == 6
    assert most_at_once(runs) == 2
    assert len(set(_pids(worker_app, tag))) >= 2  # (both workers ran some)


@pytest.mark.parametrize("workers", [(2, 2)], indirect=True, ids=["two workers"])
def test_a_killed_workers_slot_is_freed_by_its_lease_and_all_six_still_run(
    worker_app: Any, tag: str, workers: Any
) -> None:
    queue, (first, _) = workers
    results = six_calls(worker_app, tag, queue, seconds=1.5)
    victim = set(first.child_pids())
    wait_for(
        lambda: any(pid in victim for pid in _pids(worker_app, tag)),
        timeout=30,
        message="a run on the first worker",
    )
    assert first.process is not None
    os.killpg(first.process.pid, signal.SIGKILL)
    killed_at = time.time()
    first.process.wait()
    # The killed run's message (acks_late) comes back once the visibility timeout is over.
    assert [result.get(timeout=VISIBILITY + 40) for result in results] == list(range(6))
    runs = worker_app.runlog(tag).runs(killed=dict.fromkeys(victim, killed_at))
    ended = {task_id for task_id, _, end in runs if end is not None and end != killed_at}
    assert ended == {result.id for result in results}
    assert most_at_once(runs) <= 2
    # The dead run's slot was freed (by its lease: its worker's main process died with it):
    # two ran at once again after the kill.
    assert most_at_once([run for run in runs if run[1] > killed_at]) == 2


def test_a_callable_limit_is_the_limit_of_its_calls(
    worker_app: Any, tag: str, workers: Any
) -> None:
    queue = workers[0]
    small = f"{tag}-small"
    results = [
        worker_app.per_tenant.apply_async((name, index, 0.5), queue=queue)
        for name in (small, tag)
        for index in range(4)
    ]
    for result in results:
        result.get(timeout=30)
    assert most_at_once(worker_app.runlog(small).runs()) == 1
    assert most_at_once(worker_app.runlog(tag).runs()) >= 2


def _pids(worker_app: Any, tag: str) -> list[int]:
    raw = worker_app._events.lrange(f"runlog:{tag}", 0, -1)
    return [int(line.split()[3]) for line in raw if line.startswith(b"start")]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"key_concurrency": 0}, "whole number of runs, 1 or more"),
        ({"key_concurrency": "2"}, "whole number of runs"),
        ({"key_concurrency": 2, "unique_until": "started"}, "unique_until has no meaning"),
        ({"key_concurrency": 2, "debounce": 1}, "debounce has no meaning"),
        ({"key_concurrency": 2, "on_duplicate": "replace"}, "on_duplicate has no meaning"),
        (
            {"key_concurrency": 2, "key_rate_limit": "2/s", "debounce": 1},
            "debounce has no meaning with key_concurrency with key_rate_limit",
        ),
    ],
)
def test_an_invalid_combination_is_refused_naming_the_task_and_the_fix(
    options: dict[str, Any], says: str
) -> None:
    with pytest.raises(dedupe.ConfigurationError, match=r"task 'proj\.bad'") as caught:
        resolve(None, "proj.bad", _CONFIG, options)
    assert says in str(caught.value)


def test_a_unique_call_of_a_limited_task_is_refused(worker_app: Any, tag: str) -> None:
    with pytest.raises(dedupe.ConfigurationError, match=r"never deduplicated"):
        worker_app.two_at_once.apply_async_unique((tag, 0, 0.0))


# -- the slots and the line, on a real Redis (no worker) ----------------------------------------


def _ask(
    store: Store,
    keys: dict[str, str],
    task_id: str,
    token: str = "t",
    limit: int = 2,
    lease_ms: int = 60_000,
    turn_ms: int = 500,
) -> int:
    return store.take_slot(keys, task_id, token, lease_ms, limit, turn_ms, 30_000, 60_000)


def test_a_slot_redis_lost_is_counted_again_at_the_runs_next_heartbeat(
    store: Store, tag: str
) -> None:
    keys = limit_keys(f"test:{{{tag}}}")
    assert (_ask(store, keys, "a"), _ask(store, keys, "b")) == (0, 0)
    store.client.delete(keys["slots"])  # (a restart without persistence, a failover)
    leases = [Lease(keys["slots"], task_id, "t", 60_000, b"", slot=True) for task_id in "ab"]
    assert store.renew(leases) == [Renewal.RECREATED, Renewal.RECREATED]
    assert _ask(store, keys, "c") == 1  # the two live runs hold the slots again


def test_a_place_whose_message_never_comes_lapses_and_the_line_moves_on(
    store: Store, tag: str
) -> None:
    keys = limit_keys(f"test:{{{tag}}}")
    assert _ask(store, keys, "a", limit=1) == 0
    store.take_ticket(keys, "lost", 300)
    store.take_ticket(keys, "next", 60_000)
    assert store.free_slot(keys, "a", "t")
    assert _ask(store, keys, "next", limit=1) > 0  # "lost" is first in line
    time.sleep(0.4)  # (its message never came: purged, expired, lost)
    assert _ask(store, keys, "next", limit=1) == 0


@pytest.mark.parametrize(
    ("ahead", "limit", "seconds"),
    [(1, 1, 0.5), (3, 1, 1.5), (3, 2, 1.0), (4, 2, 1.0), (999, 1, 30.0)],
)
def test_a_waiting_run_is_asked_back_a_turn_for_every_limit_runs_ahead(
    ahead: int, limit: int, seconds: float
) -> None:
    assert come_back(ahead, limit, 0.5, 30.0) == seconds


def test_a_run_far_back_in_line_keeps_its_place_until_it_is_asked_back(
    store: Store, tag: str
) -> None:
    # Seen in the full chaos run: the nth waiting run is sent again in n turns, but its place
    # lapsed a turn and a lease after its ask; the asks of others dropped it, and it came
    # back to the back of the line, behind calls made after it, again and again.
    keys = limit_keys(f"test:{{{tag}}}")

    def ask(task_id: str) -> int:
        return _ask(store, keys, task_id, limit=1, lease_ms=300, turn_ms=100)

    assert _ask(store, keys, "running", limit=1) == 0  # (a minute's lease)
    assert [ask(f"w{n}") for n in range(6)] == [1, 2, 3, 4, 5, 6]
    time.sleep(0.45)  # (past a turn and a lease: w0's and w1's places lapse, unasked)
    newcomer = ask("late")
    assert ask("w5") < newcomer  # asked back in 6 turns: its place stands
    assert ask("w4") < ask("w5")  # (and the line keeps call order)


def test_a_run_without_a_place_goes_to_the_back_of_the_line(store: Store, tag: str) -> None:
    keys = limit_keys(f"test:{{{tag}}}")
    assert _ask(store, keys, "a", limit=1) == 0
    store.take_ticket(keys, "b", 60_000)
    assert _ask(store, keys, "bypass", limit=1) > 0  # (b, then the bypass)
    assert store.free_slot(keys, "a", "t")
    assert _ask(store, keys, "bypass", limit=1) > 0  # (b first)
    assert _ask(store, keys, "b", limit=1) == 0


def test_a_call_revoked_before_its_turn_leaves_the_line_at_once(worker_app: Any, tag: str) -> None:
    queue = f"limits-revoked-{tag}"
    worker = WorkerProcess(worker_app.app, {"DEDUPE_TEST_QUEUE": queue}, concurrency=1)
    worker.start()
    try:
        task = worker_app.one_at_a_time
        first = task.apply_async((tag, 0, 2.0), queue=queue)
        wait_for(lambda: worker_app.runlog(tag).runs(), message="the first run")
        revoked = task.apply_async((tag, 1, 0.0), queue=queue)
        worker_app.app.control.revoke(revoked.id)
        last = task.apply_async((tag, 2, 0.0), queue=queue)
        # Its place would hold the line for unique_ttl (an hour) had it stayed.
        assert (first.get(timeout=20), last.get(timeout=20)) == (0, 2)
        assert revoked.state == "REVOKED"
    finally:
        worker.stop()


def test_the_main_process_frees_a_killed_childs_slot_long_before_its_lease(
    worker_app: Any, tag: str
) -> None:
    # A worker of its own: the session's worker may have children that an earlier test's
    # revoke(terminate=True) marked (billiard then takes their death for a controlled one,
    # and sends no task_failure).
    queue = f"limits-child-{tag}"
    worker = WorkerProcess(worker_app.app, {"DEDUPE_TEST_QUEUE": queue})
    worker.start()
    try:
        task = worker_app.one_at_a_time_long_lease
        killed = task.apply_async((tag, 0, 60.0), queue=queue)
        pid = int(wait_for(lambda: worker_app._events.get(f"pid:{tag}"), message="the run"))
        # Killed before the pool's parent learns which job its child runs, the parent sends
        # no task_failure (the lease frees the slot then): wait until the parent lists it.
        wait_for(lambda: _active_in_parent(worker_app, killed.id), message="the parent knows it")
        waiting = task.apply_async((tag, 1, 0.0), queue=queue)
        os.kill(pid, signal.SIGKILL)
        # The pool sees its child gone within about 5 s (its maintain_pool timer); the slot
        # is freed then, far within the 30 s lease.
        assert waiting.get(timeout=15) == 1
        with pytest.raises(WorkerLostError):
            killed.get(timeout=5)
    finally:
        worker.stop()


def _active_in_parent(worker_app: Any, task_id: str) -> bool:
    active = worker_app.app.control.inspect(timeout=0.5).active() or {}
    return any(job["id"] == task_id for jobs in active.values() for job in jobs)


def test_a_later_call_that_asks_first_waits_for_the_earlier_calls_turn(
    store: Store, tag: str
) -> None:
    keys = limit_keys(f"test:{{{tag}}}")
    for task_id in ("a", "b", "c", "d"):
        store.take_ticket(keys, task_id, 60_000)  # (call order: a, b, c, d)
    assert [_ask(store, keys, task_id) for task_id in ("d", "c", "a", "b")] == [2, 1, 0, 0]
    assert store.free_slot(keys, "a", "t")
    assert [_ask(store, keys, task_id) for task_id in ("d", "c")] == [1, 0]


def test_a_call_of_a_limited_task_with_an_option_of_dedup_is_refused(
    worker_app: Any, tag: str
) -> None:
    with pytest.raises(
        dedupe.ConfigurationError, match=r"unique_until has no meaning with key_concurrency"
    ):
        worker_app.two_at_once.apply_async((tag, 0, 0.0), unique_until="started")


def test_a_call_whose_publish_fails_leaves_no_place_in_line(
    make_app: Callable[..., Celery], redis_client: redis.Redis
) -> None:
    app = make_app(broker=UNREACHABLE, **FAILS_AT_ONCE)

    @app.task(shared=False, base=dedupe.DedupeTask, key_concurrency=1, unique_on=("x",))
    def job(x: int) -> None: ...

    with pytest.raises(OperationalError):
        job.delay(1)
    _, keys = keys_of_call(job, (1,), None, app, {})
    assert redis_client.zcard(limit_keys(keys.call)["line"]) == 0
    assert keys_with_prefix(redis_client, app.conf.dedupe_key_prefix) == []


def test_on_rabbitmq_six_calls_all_run_never_more_than_two_at_once(
    worker_app: Any, rabbitmq_url: str, tag: str
) -> None:
    queue = f"limits-amqp-{tag}"
    env = {
        "DEDUPE_TEST_BROKER": rabbitmq_url,
        "DEDUPE_TEST_REDIS": worker_app.REDIS,
        "DEDUPE_TEST_QUEUE": queue,
    }
    producer = Celery(
        "worker_app", broker=rabbitmq_url, backend=worker_app.REDIS, set_as_current=False
    )
    producer.conf.update(
        task_default_queue=queue,
        dedupe_redis_url=worker_app.REDIS,
        dedupe_key_prefix=worker_app.PREFIX,
        broker_transport_options={"confirm_publish": True},
        broker_connection_retry_on_startup=True,
    )
    dedupe.install(producer)

    @producer.task(
        shared=False,
        name=worker_app.two_at_once.name,
        base=dedupe.DedupeTask,
        unique_on=("tag",),
        key_concurrency=2,
    )
    def two_at_once(tag: str, index: int, seconds: float) -> int: ...

    worker = WorkerProcess(producer, env, concurrency=4)  # (pinged through RabbitMQ)
    worker.start()
    try:
        results = [two_at_once.delay(tag, index, 1.0) for index in range(6)]
        assert [result.get(timeout=30) for result in results] == list(range(6))
    finally:
        worker.stop()
        with producer.connection_for_write() as connection:
            connection.default_channel.queue_delete(queue)
        producer.close()
    runs = worker_app.runlog(tag).runs()
    assert overtaken(runs, [result.id for result in results]) <= 1
    assert most_at_once(runs) == 2
