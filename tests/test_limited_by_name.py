"""A limited task called by name from a process that does not import it (issue 41, item 3):
the workers keep the names of their limited tasks in the dedup Redis, and such a call is
published as the task's ``delay`` publishes it (every call accepted), its run taking its
turn at the worker. Real Redis, a real prefork worker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

import dedupe
from dedupe.errors import ConfigurationError
from dedupe.runs.limited_names import name_limited_tasks
from dedupe.runs.runtime import runtime_of
from dedupe.values.keys import limited_names_key

from .helpers import WorkerProcess, wait_for
from .test_key_concurrency import most_at_once

pytestmark = [pytest.mark.slow]


@pytest.fixture
def queue(tag: str) -> str:
    return f"byname-{tag}"


@pytest.fixture
def service(worker_app: Any, queue: str) -> Iterator[Celery]:
    """An app of the same broker, store and prefix that imports none of the tasks."""
    app = Celery("service", broker=worker_app.BROKER, backend=worker_app.REDIS)
    app.conf.update(
        task_default_queue=queue,
        dedupe_redis_url=worker_app.STORE,
        dedupe_key_prefix=worker_app.PREFIX,
    )
    dedupe.install(app)
    # (The test module's tasks are shared with every app: this one forgets them.)
    for name in [name for name in app.tasks if name.startswith("tests.")]:
        app.tasks.unregister(name)
    yield app
    app.close()


def test_calls_by_name_of_a_limited_task_are_all_accepted_and_take_their_turn(
    worker_app: Any, tag: str, queue: str, service: Celery
) -> None:
    name = worker_app.one_at_once.name
    worker = WorkerProcess(worker_app.app, {"DEDUPE_TEST_QUEUE": queue}, concurrency=2)
    worker.start()
    client = redis.Redis.from_url(worker_app.STORE)
    try:
        wait_for(
            lambda: client.sismember(limited_names_key(worker_app.PREFIX), name),
            message="the worker named its limited tasks",
        )
        # (Three calls of one call: as three .delay() of a limited task, three runs.)
        results = [dedupe.apply_async(name, (tag, 0, 0.5), app=service) for _ in range(3)]
        assert [result.deduplicated for result in results] == [False] * 3
        assert [result.get(timeout=30) for result in results] == [0, 0, 0]
        assert len({result.id for result in results}) == 3
    finally:
        client.close()
        worker.stop()
    assert most_at_once(worker_app.runlog(tag).runs()) == 1  # (two pool processes)


def test_a_call_by_name_of_a_limited_task_cannot_name_its_key(
    worker_app: Any, service: Celery, redis_client: redis.Redis
) -> None:
    name = worker_app.one_at_once.name
    redis_client.sadd(limited_names_key(worker_app.PREFIX), name)
    with pytest.raises(ConfigurationError, match=rf"{name}.*unique_on.*import it here"):
        dedupe.apply_async(name, ("x", 0, 0.0), app=service, unique_on=("tag",))


def test_a_worker_names_its_limited_tasks_and_takes_out_one_that_lost_its_limit(
    make_app: Any, redis_client: redis.Redis
) -> None:
    app = make_app()

    @app.task(shared=False, base=dedupe.DedupeTask, name="jobs.limited", key_concurrency=2)
    def limited() -> None: ...

    @app.task(shared=False, base=dedupe.DedupeTask, name="jobs.plain", unique=True)
    def plain() -> None: ...

    key = limited_names_key(app.conf.dedupe_key_prefix)
    redis_client.sadd(key, "jobs.plain")  # (limited once, by an older deployment)
    name_limited_tasks(runtime_of(app))
    named = redis_client.smembers(key)
    assert b"jobs.limited" in named
    assert b"jobs.plain" not in named
    assert redis_client.pttl(key) > 0
