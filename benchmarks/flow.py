"""Flow control per key (issue 31): what a call of each mode costs beside a plain apply_async
on a Redis broker, accepted (a new key each call) and duplicate (the key held), and the
server's time per decision (INFO commandstats: EVALSHA's microseconds per call).

Each mode's task holds its own key for the duplicate variants; accepted calls are cleared
(queue and keys) untimed after each round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
from celery import Celery

import dedupe

from ._env import Timings, Variant, interleaved, make_app

PLAIN = "plain apply_async"
#: Each mode: its task's options.
MODES: dict[str, dict[str, Any]] = {
    "unique (finished)": {},
    "debounce=60": {"debounce": 60},
    'on_duplicate="replace"': {"on_duplicate": "replace"},
}
#: The limits: every call is accepted, all of one key here (its line or its schedule grows
#: through the round, as under a burst; cleared after each round).
LIMITS: dict[str, dict[str, Any]] = {
    "key_concurrency=2": {"key_concurrency": 2},
    'key_rate_limit="10/s"': {"key_rate_limit": "10/s"},
    'key_concurrency=2 with key_rate_limit="10/s"': {
        "key_concurrency": 2,
        "key_rate_limit": "10/s",
    },
}


def _tasks(app: Celery) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    @app.task(shared=False)
    def plain(x: int) -> None: ...

    def task(name: str, **options: Any) -> Any:
        def body(x: int) -> None: ...

        decorate: Any = app.task(shared=False, base=dedupe.DedupeTask, name=name, **options)
        return decorate(body)

    tasks = {
        mode: task(f"flow.unique.{index}", unique=True, **options)
        for index, (mode, options) in enumerate(MODES.items())
    }
    limited = {
        mode: task(f"flow.limited.{index}", **options)
        for index, (mode, options) in enumerate(LIMITS.items())
    }
    return plain, tasks, limited


def run(url: str, rounds: int, calls: int) -> tuple[Timings, dict[str, float]]:
    """Microseconds per call of each variant per round; and EVALSHA's server microseconds
    per call, per variant."""
    client = redis.Redis.from_url(url)
    app = make_app(url)
    plain, tasks, limited = _tasks(app)
    prefix = app.conf.dedupe_key_prefix

    def hold() -> None:
        for task in tasks.values():
            task.delay(-1)

    def clear() -> None:
        client.delete(app.conf.task_default_queue)
        keys = list(client.scan_iter(match=f"{prefix}:*", count=10_000))
        if keys:
            client.delete(*keys)
        hold()

    hold()
    variants: dict[str, Variant] = {PLAIN: (lambda i: plain.apply_async((i,)), clear)}
    for mode, task in tasks.items():
        variants[f"{mode} accepted"] = (_call(task, lambda i: i), clear)
        variants[f"{mode} duplicate"] = (_call(task, lambda i: -1), None)
    for mode, task in limited.items():
        variants[f"{mode}, one key"] = (_call(task, lambda i: 0), clear)
    try:
        timings = interleaved(variants, rounds, calls)
        server = {
            name: _server_time(client, call, calls, reset)
            for name, (call, reset) in variants.items()
            if name != PLAIN
        }
    finally:
        clear()
        app.close()
    return timings, server


def _call(task: Any, argument: Callable[[int], int]) -> Callable[[int], Any]:
    return lambda i: task.apply_async((argument(i),))


def _server_time(
    client: redis.Redis, call: Callable[[int], Any], calls: int, reset: Callable[[], Any] | None
) -> float:
    """EVALSHA's microseconds per call on the server over ``calls`` calls (scripts only)."""
    client.config_resetstat()
    for i in range(calls):
        call(10_000_000 + i)
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    if reset is not None:
        reset()
    return float(stats.get("usec_per_call", 0.0))
