"""key_concurrency's line held in Redis (issue 41): 100 calls of one key with
``key_concurrency=1`` and 10 ms runs on one prefork worker, against 100 plain runs back to
back; the broker messages per limited call (LPUSHes, INFO commandstats); the Redis server's
time per hand-off (EVALSHA's microseconds per run end, which frees the slot and pushes the
next call). Five rounds; medians and ranges.

``python -m benchmarks.lines [--redis URL] [--rounds N] [--calls N]`` (a throwaway
redis-server by default: commandstats are the server's own). Results: docs/cost.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from ._env import prefork_worker, redis_url, stop_worker


def _stats(client: redis.Redis) -> dict[str, Any]:
    return dict(client.info("commandstats"))


def _calls(stats: dict[str, Any], command: str) -> tuple[int, int]:
    entry = stats.get(f"cmdstat_{command}", {})
    return int(entry.get("calls", 0)), int(entry.get("usec", 0))


def one_round(task: Any, calls: int, client: redis.Redis, queue: str) -> dict[str, float]:
    """``calls`` calls of ``task`` at once; seconds from the first call to the last result,
    broker pushes per call, and EVALSHA microseconds per call."""
    before = _stats(client)
    began = time.perf_counter()
    results = [task.apply_async((0, index), queue=queue) for index in range(calls)]  # one key
    for result in results:
        result.get(timeout=120)
    took = time.perf_counter() - began
    after = _stats(client)
    pushes = _calls(after, "lpush")[0] - _calls(before, "lpush")[0]
    evals = [
        a - b for a, b in zip(_calls(after, "evalsha"), _calls(before, "evalsha"), strict=True)
    ]
    return {
        "seconds": took,
        "pushes per call": pushes / calls,
        "evalsha us per call": evals[1] / calls,
        "evalsha calls per call": evals[0] / calls,
    }


def hand_off_cost(client: redis.Redis, calls: int = 100) -> float:
    """Server microseconds of one hand-off alone (end_turn.lua: a run's slot freed and the
    next call's message pushed), with ``calls`` calls held in the line: EVALSHA's usec of
    the end_turn calls only (each run's start, untimed, between them)."""
    import uuid

    from dedupe.store.store import Store
    from dedupe.values.limits import limit_keys

    store = Store(client)
    if not hasattr(store, "hold_or_push"):
        return float("nan")  # (a version before issue 41: no line held in Redis)
    keys = limit_keys(f"lines-bench:{{{uuid.uuid4().hex}}}")
    ids = [f"call{index}" for index in range(calls + 1)]
    for task_id in ids:
        store.hold_or_push(
            keys,
            task_id,
            lease_ms=60_000,
            limit=1,
            ttl_ms=600_000,
            message=f'{{"id": "{task_id}"}}',
            lists=[keys["line"] + ":q"],
        )
    spent = 0
    for task_id in ids[:-1]:
        store.take_turn(keys, task_id, "t", lease_ms=60_000, limit=1, ttl_ms=600_000, options="")
        before = _calls(_stats(client), "evalsha")[1]
        store.end_turn(keys, f"{task_id} t", lease_ms=60_000, limit=1)
        spent += _calls(_stats(client), "evalsha")[1] - before
    client.delete(*keys.values(), keys["line"] + ":q", "lines-bench:lines")
    return spent / calls


def _summary(
    name: str, rounds: list[dict[str, float]], key: str, fmt: Callable[[float], str]
) -> str:
    values = [r[key] for r in rounds]
    return f"{name}: {key} {fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis", help="a Redis URL (default: a throwaway redis-server)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4, help="the worker's processes")
    options = parser.parse_args(argv)
    with redis_url(options.redis) as url:
        os.environ["DEDUPE_LINES_REDIS"] = url
        from . import _lines_app

        client = redis.Redis.from_url(url)
        # The runs back to back: a worker of one process; the limited calls: of several.
        app, module = _lines_app.app, "benchmarks._lines_app"
        serial = prefork_worker(app, module, "serial", "serial", 1)
        worker = prefork_worker(
            app, module, _lines_app.QUEUE, _lines_app.QUEUE, options.concurrency
        )
        try:
            plain: list[dict[str, float]] = []
            limited: list[dict[str, float]] = []
            hand_offs: list[float] = []
            one_round(_lines_app.limited, 10, client, _lines_app.QUEUE)  # (warm)
            one_round(_lines_app.plain, 10, client, "serial")
            for _ in range(options.rounds):
                plain.append(one_round(_lines_app.plain, options.calls, client, "serial"))
                limited.append(
                    one_round(_lines_app.limited, options.calls, client, _lines_app.QUEUE)
                )
                hand_offs.append(hand_off_cost(client, options.calls))
        finally:
            for started in (serial, worker):
                stop_worker(started)
    print(f"{options.calls} calls of one key, 10 ms runs; one prefork worker of")
    print(f"{options.concurrency} for the limited calls, of 1 for the plain ones back to back")
    two = "{:.2f}".format
    for name, rounds in (("plain, back to back", plain), ("key_concurrency=1", limited)):
        print(_summary(name, rounds, "seconds", two))
        print(_summary(name, rounds, "pushes per call", two))
        print(_summary(name, rounds, "evalsha us per call", "{:.1f}".format))
        print(_summary(name, rounds, "evalsha calls per call", two))
    print(
        f"server time per hand-off (end_turn.lua, {options.calls} held): "
        f"{statistics.median(hand_offs):.1f} us ({min(hand_offs):.1f}-{max(hand_offs):.1f})"
    )
    ratios = [lim["seconds"] / pl["seconds"] for lim, pl in zip(limited, plain, strict=True)]
    print(
        f"key_concurrency=1 / back to back: {statistics.median(ratios):.2f}"
        f" ({min(ratios):.2f}-{max(ratios):.2f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
