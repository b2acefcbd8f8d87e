"""debounce / debounce_max_wait: a burst of calls of one key runs once, after the quiet
period (or the max wait), with the last call's arguments, under one task id. Real Redis, a
real prefork worker."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

import dedupe
from dedupe.producer.guard import keys_of_call
from dedupe.values.config import DedupeConfig
from dedupe.values.options import resolve

from .helpers import wait_for

pytestmark = [pytest.mark.slow]

_CONFIG = DedupeConfig(redis_url="")


@pytest.mark.usefixtures("prefork_worker")
def test_a_burst_runs_once_with_the_last_arguments_under_one_id(worker_app: Any, tag: str) -> None:
    results = []
    for value in range(8):
        results.append(worker_app.debounced.delay(tag, value))
        time.sleep(0.2)
    assert {result.id for result in results} == {results[0].id}
    assert [result.deduplicated for result in results] == [False] + [True] * 7
    assert [result.get(timeout=20) for result in results] == [7] * 8
    time.sleep(1.5)  # (a second run would have started by now)
    assert worker_app.values_run(tag) == [(results[0].id, "7")]


@pytest.mark.usefixtures("prefork_worker")
def test_an_endless_burst_runs_at_least_once_per_max_wait_the_last_with_the_last_arguments(
    worker_app: Any, tag: str
) -> None:
    results = []
    end = time.monotonic() + 9
    value = 0
    while time.monotonic() < end:
        results.append(worker_app.debounced_capped.delay(tag, value))
        value += 1
        time.sleep(0.3)
    for result in results:
        result.get(timeout=30)
    time.sleep(1.5)
    runs = worker_app.values_run(tag)
    assert 2 <= len(runs) <= 5, runs
    assert runs[-1] == (results[-1].id, str(value - 1))
    # Every call's id is one of the runs', and each run took the last call of its burst.
    ids = [task_id for task_id, _ in runs]
    assert {result.id for result in results} == set(ids)
    for task_id, ran in runs:
        last = max(index for index, result in enumerate(results) if result.id == task_id)
        assert ran == str(last)


def test_debounce_means_unique_until_started(worker_app: Any) -> None:
    options = resolve(worker_app.debounced._get_current_object(), "t", _CONFIG)
    assert (options.debounce, options.until, options.latest) == (1.0, "started", "debounce")


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"debounce": 2, "debounce_max_wait": 1}, "debounce_max_wait (1) is shorter"),
        ({"debounce_max_wait": 5}, "needs one: set debounce"),
        ({"debounce": 1, "unique_until": "finished"}, 'unique_until="started"'),
        ({"debounce": 1, "unique_until": "window"}, 'unique_until="started"'),
        ({"debounce": 1, "on_duplicate": "raise"}, 'on_duplicate="raise" would refuse'),
        ({"debounce": 0}, "positive number of seconds"),
        ({"on_duplicate": "replace", "unique_until": "window"}, "throttle window"),
    ],
)
def test_an_invalid_combination_is_refused_naming_the_task_and_the_fix(
    options: dict[str, Any], says: str
) -> None:
    with pytest.raises(dedupe.ConfigurationError, match=r"task 'proj\.bad'") as caught:
        resolve(None, "proj.bad", _CONFIG, options)
    assert says in str(caught.value)


@pytest.mark.usefixtures("prefork_worker")
def test_arguments_over_the_bound_are_refused_before_anything_is_written(
    worker_app: Any, tag: str
) -> None:
    with pytest.raises(dedupe.ArgumentsTooLarge, match="debounced"):
        worker_app.debounced.delay(tag, "x" * 70_000)
    assert dedupe.lookup(worker_app.debounced, (tag, 0)) is None


@pytest.mark.usefixtures("prefork_worker")
def test_a_debounced_call_with_a_countdown_is_refused(worker_app: Any, tag: str) -> None:
    with pytest.raises(dedupe.ConfigurationError, match="drop countdown"):
        worker_app.debounced.apply_async((tag, 0), countdown=5)


@pytest.mark.usefixtures("prefork_worker")
def test_a_bursts_run_leaves_nothing_of_its_arguments_behind(worker_app: Any, tag: str) -> None:
    results = [worker_app.debounced.delay(tag, value) for value in range(3)]
    assert [result.get(timeout=20) for result in results] == [2] * 3
    key = dedupe.lookup(worker_app.debounced, (tag, 0))
    assert key is None  # (the run ended: the key is free)
    _, keys = keys_of_call(worker_app.debounced, (tag, 0), None, None, {})
    client = redis.Redis.from_url(str(worker_app.STORE))
    try:
        wait_for(lambda: not client.exists(keys.latest), message="the arguments' hash gone")
    finally:
        client.close()
