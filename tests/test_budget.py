"""The Redis cost of dedup, counted on a Redis that holds only the dedup records."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery, signals

import dedupe
from dedupe.demo.server import RedisServer

from .conftest import RedisFactory, in_process_worker


@pytest.fixture
def dedup_redis(redis_factory: RedisFactory) -> RedisServer:
    return redis_factory()


@pytest.fixture
def counted(make_app: Callable[..., Celery], dedup_redis: RedisServer) -> Any:
    app = make_app(dedupe_redis_url=dedup_redis.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> int:
        return x

    reader = redis.Redis.from_url(dedup_redis.url)
    signaller = redis.Redis.from_url(dedup_redis.url)
    signaller.ping()  # connected now: its handshake must not land inside a measurement

    def delta(action: Callable[[], Any]) -> int:
        """Round trips to the dedup Redis during ``action``, from MONITOR: commands that
        Lua scripts run inside the server (client type "lua") are not round trips."""
        seen: list[str] = []
        watching = threading.Event()
        marker = f"end-{threading.get_ident()}"

        def watch() -> None:
            with reader.monitor() as monitor:
                watching.set()
                for command in monitor.listen():
                    if marker in command["command"]:
                        return
                    if command.get("client_type") != "lua":
                        seen.append(command["command"])

        watcher = threading.Thread(target=watch)
        watcher.start()
        assert watching.wait(5)
        time.sleep(0.05)  # MONITOR is registered once its reply came back
        action()
        signaller.echo(marker)
        watcher.join(10)
        return len(seen)

    dedupe.lookup(job, (0,))  # open the connection: its handshake is not a call's cost
    job.delay(-1)  # load the scripts
    return app, job, delta, dedup_redis


def test_an_accepted_call_on_a_dedup_redis_of_its_own_costs_an_enqueue_and_a_confirm(
    counted: Any,
) -> None:
    # The provisional path: the record is written provisional (one round trip), then made
    # durable once the publish returns (sent without waiting for its reply).
    _, job, delta, _ = counted
    assert delta(lambda: job.delay(1)) == 2


def test_an_accepted_call_on_the_brokers_redis_costs_one_round_trip_push_included(
    make_app: Callable[..., Celery], dedup_redis: RedisServer
) -> None:
    app = make_app(broker=dedup_redis.url, dedupe_redis_url=dedup_redis.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> int:
        return x

    job.delay(-1)  # connections made, scripts loaded
    client = redis.Redis.from_url(dedup_redis.url)
    client.config_resetstat()
    job.delay(1)
    calls = {
        name: stat["calls"]
        for name, stat in client.info("commandstats").items()
        # CONFIG RESETSTAT: "config" before Redis 7, "config|resetstat" since.
        if name.split("|")[0] != "cmdstat_config"
    }
    # One EVALSHA; the GET, SET and LPUSH ran inside it.
    assert calls == {"cmdstat_evalsha": 1, "cmdstat_get": 1, "cmdstat_set": 1, "cmdstat_lpush": 1}


def test_a_duplicate_call_costs_one_round_trip(counted: Any) -> None:
    _, job, delta, _ = counted
    job.delay(2)
    assert delta(lambda: job.delay(2)) == 1


@pytest.mark.slow
def test_a_run_costs_one_round_trip_at_start_and_one_at_the_end(counted: Any) -> None:
    app, job, delta, _ = counted
    ended = threading.Event()
    # Known before the call: the run may end before apply_async has returned.
    expected = str(uuid.uuid4())

    def on_postrun(task_id: str = "", **_: Any) -> None:
        # dedupe's own postrun handler was connected first: it has released by now.
        if task_id == expected:
            ended.set()

    signals.task_postrun.connect(on_postrun, weak=False)
    try:
        with in_process_worker(app):
            job.delay(-2).get(timeout=10)  # the worker's first run loads its scripts

            def call_and_run() -> None:
                job.apply_async((3,), task_id=expected)
                assert ended.wait(10)

            # The accepted call (enqueue and confirm), then the run's claim and release.
            assert delta(call_and_run) == 4
    finally:
        signals.task_postrun.disconnect(on_postrun)
    assert dedupe.lookup(job, (3,)) is None


def test_calls_work_again_after_redis_restarts_and_forgets_the_scripts(counted: Any) -> None:
    _, job, _, server = counted
    server.stop()
    server.start()
    assert job.delay(4).deduplicated is False
    assert job.delay(4).deduplicated is True
