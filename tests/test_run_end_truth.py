"""A run's end tells the truth at once: its key is free before its result can be read, and a
release written to a connection that died is sent again, before the worker process takes its
next task. Real prefork workers and Redis.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import dedupe

from .conftest import RedisFactory
from .helpers import WorkerProcess, app_with_a_store_of_its_own, producer_stub, wait_for

pytestmark = pytest.mark.slow


def _answered_with_the_finished_run(task: Any, tag: str, rounds: int, *, fails: bool) -> list[int]:
    """Call, wait with ``.get()`` for the result (``fails``: the task's error), call again at
    once: the rounds whose second call was answered with the finished run."""

    def settled(result: Any, argument: str) -> None:
        if fails:
            with pytest.raises(ValueError, match=argument):
                result.get(timeout=10)
        else:
            assert result.get(timeout=10) == argument

    duplicates = []
    for index in range(rounds):
        argument = f"{tag}-{index}"
        settled(task.delay(argument), argument)
        second = task.delay(argument)
        if second.deduplicated:
            duplicates.append(index)
        settled(second, argument)
    return duplicates


@pytest.mark.usefixtures("prefork_worker")
def test_a_call_made_after_get_returned_is_a_new_call_not_the_finished_run(
    worker_app: Any, tag: str
) -> None:
    assert _answered_with_the_finished_run(worker_app.ok, tag, 100, fails=False) == []


@pytest.mark.usefixtures("prefork_worker")
def test_a_call_made_after_get_is_new_though_a_slow_postrun_receiver_runs_before_dedupes(
    worker_app: Any, tag: str
) -> None:
    task = worker_app.ok_behind_a_slow_receiver
    assert _answered_with_the_finished_run(task, tag, 10, fails=False) == []


@pytest.mark.usefixtures("prefork_worker")
def test_a_call_made_after_a_failed_get_is_a_new_call_not_the_finished_run(
    worker_app: Any, tag: str
) -> None:
    assert _answered_with_the_finished_run(worker_app.fail, tag, 60, fails=True) == []


@pytest.mark.usefixtures("prefork_worker")
def test_a_task_calling_itself_within_its_run_keeps_its_key_until_the_run_ends(
    worker_app: Any, tag: str
) -> None:
    assert worker_app.calls_itself.delay(tag, 1).get(timeout=10) == "running"


@pytest.mark.usefixtures("prefork_worker")
def test_a_chain_its_task_cuts_short_stops_as_with_celery(worker_app: Any, tag: str) -> None:
    chain = worker_app.cuts_its_chain.si(tag) | worker_app.ok.si(f"{tag}-next")
    chain.apply_async()
    wait_for(lambda: [end for *_, end in worker_app.runlog(tag).runs() if end], message="ran")
    time.sleep(1.0)  # (the next task, were it sent, runs at once on the idle worker)
    assert worker_app.runlog(f"{tag}-next").runs() == []


@pytest.mark.usefixtures("prefork_worker")
def test_calls_after_a_soft_time_limit_cut_one_short_are_answered_truly(
    worker_app: Any, tag: str
) -> None:
    # Celery's SoftTimeLimitExceeded is raised by a signal handler wherever the task is: here
    # in the middle of a dedup call, which leaves a reply owed on the connection.
    # (Six runs: a limit that fires between two calls tests nothing, and it may.)
    runs = [worker_app.calls_until_soft_limit.delay(f"{tag}-{index}") for index in range(6)]
    outcomes = [run.get(timeout=30) for run in runs]
    assert all(outcome["repeats"] > 0 for outcome in outcomes)
    assert [outcome["wrong"] for outcome in outcomes] == [[]] * 6


@pytest.fixture
def own_store_worker(
    redis_factory: RedisFactory, worker_app: Any, tag: str
) -> Iterator[tuple[Any, Any]]:
    """An app of worker_app's tasks whose dedup Redis is a server of the test's own, and a
    prefork worker (one child) that runs them."""
    store = redis_factory()
    queue = f"run-end-{tag}"
    with app_with_a_store_of_its_own(worker_app, worker_app.BROKER, queue, store) as producer:
        redelivered = producer_stub(
            producer, worker_app.redelivered, acks_late=True, reject_on_worker_lost=True
        )
        # A lease long enough that no renewal touches the dedup Redis during the run.
        env = {"DEDUPE_TEST_QUEUE": queue, "DEDUPE_TEST_STORE": store.url}
        env["DEDUPE_TEST_LEASE"] = "30"
        worker = WorkerProcess(producer, env, concurrency=1)
        worker.start()
        try:
            yield redelivered, store
        finally:
            worker.stop()


@pytest.mark.parametrize("ignore_result", [False, True], ids=["result-stored", "result-ignored"])
def test_a_release_written_to_a_dropped_connection_is_sent_again_at_the_runs_end(
    own_store_worker: tuple[Any, Any], worker_app: Any, tag: str, ignore_result: bool
) -> None:
    task, store = own_store_worker
    admin = redis.Redis.from_url(store.url)
    try:
        # A run before: the worker process has sent a release already (its script known).
        assert task.delay(f"{tag}-before", 0).get(timeout=10) == f"{tag}-before"
        result = task.apply_async((tag, 0.4), ignore_result=ignore_result)
        wait_for(
            lambda: (h := dedupe.lookup(task, (tag, 0.4))) is not None and h.state == "running",
            message="the run started",
        )
        # Every client of the dedup Redis is dropped mid-run, as Sentinel does to a demoted
        # master's clients: the worker's next write goes to a socket the server closed.
        admin.client_kill_filter(_type="normal", skipme=True)
        wait_for(
            lambda: [end for _, _, end in worker_app.runlog(tag).runs() if end],
            message="the run ended",
        )
        # The worker takes no other task: only the run's own end can free its key.
        wait_for(
            lambda: dedupe.lookup(task, (tag, 0.4)) is None,
            timeout=10,  # (well within the 30 s lease: only the end can free it so soon)
            message="the key freed by the run's end (not by a next call)",
        )
        if not ignore_result:
            assert result.get(timeout=10) == tag
    finally:
        admin.close()
