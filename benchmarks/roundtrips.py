"""Redis commands per call and per run, from INFO commandstats: on the broker's own Redis (the
one-step path: the push runs inside the script) and on a Redis that holds only the dedup
records (the broker is another server: the provisional path)."""

from __future__ import annotations

import threading
from typing import Any

import redis
from celery import signals

import dedupe
from dedupe.demo.server import RedisServer

from ._env import commandstats, in_process_worker, make_app

_TOP_LEVEL = ("evalsha", "eval", "script|load", "script")


def _stats(client: redis.Redis) -> dict[str, int]:
    return {name: calls for name, (calls, _) in commandstats(client).items()}


def _delta(client: redis.Redis, action: Any, count: int) -> tuple[float, float]:
    """(round trips, commands including those run inside scripts) per action."""
    before = _stats(client)
    action()
    after = _stats(client)
    delta = {name: after[name] - before.get(name, 0) for name in after}
    top = sum(calls for name, calls in delta.items() if name in _TOP_LEVEL)
    return top / count, sum(delta.values()) / count


def run(broker_url: str, calls: int = 1000) -> dict[str, tuple[float, float]]:
    results = _one_step(calls)
    results.update(_own_redis(broker_url, calls))
    return results


def _unique_job(app: Any) -> Any:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, ignore_result=True)
    def job(x: int) -> None: ...

    job.delay(-1)  # scripts loaded, connections open (and a holder for the duplicates)
    return job


def _calls(client: redis.Redis, job: Any, calls: int, where: str) -> dict[str, Any]:
    """Round trips of accepted calls (new keys), then of duplicates (the held key)."""
    accepted = _delta(client, lambda: [job.delay(i) for i in range(calls)], calls)
    duplicate = _delta(client, lambda: [job.delay(-1) for _ in range(calls)], calls)
    return {f"accepted call, {where}": accepted, f"duplicate call, {where}": duplicate}


def _one_step(calls: int) -> dict[str, tuple[float, float]]:
    with RedisServer() as server:
        app = make_app(server.url)
        client = redis.Redis.from_url(server.url)
        results = _calls(client, _unique_job(app), calls, "the broker's Redis")
        app.close()
        return results


def _own_redis(broker_url: str, calls: int) -> dict[str, tuple[float, float]]:
    with RedisServer() as store_server:
        app = make_app(broker_url, dedupe_redis_url=store_server.url)
        client = redis.Redis.from_url(store_server.url)
        results = _calls(client, _unique_job(app), calls, "a dedup Redis of its own")
        done = threading.Event()
        finished = 0

        def count(**_: Any) -> None:
            nonlocal finished
            finished += 1
            if finished == calls + 1:
                done.set()

        def drain() -> None:
            # The worker starts consuming as it starts: count from before it exists.
            with in_process_worker(app):
                if not done.wait(120):
                    raise RuntimeError(f"only {finished} of {calls + 1} tasks ran")

        signals.task_postrun.connect(count, weak=False)
        try:
            results["task run (claim + release)"] = _delta(client, drain, calls + 1)
        finally:
            signals.task_postrun.disconnect(count)
        app.close()
        return results
