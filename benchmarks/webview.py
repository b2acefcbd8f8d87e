"""The web view at scale, over real HTTP (uvicorn in a thread, httpx) against a Redis of its
own filled with live keys in the library's format: at each size, the first page, a filtered
page that finds the 3 running keys among them (every request of its walk), the next page,
and the server's Redis reads per minute while no page looks. Each row checks what it found.
Also: what the view's event log costs a call while no view runs."""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import redis
import uvicorn

from dedupe import events
from dedupe.demo.server import RedisServer
from dedupe.runs.runtime import runtime_of
from dedupe.values.keys import format_call_key
from dedupe.values.record import pack_queued, pack_running
from dedupe.webview import recorder
from dedupe.webview.server import build

from ._env import make_app
from .scale import FILL

#: The commands that read keys (what a view costs Redis).
READS = ("scan", "get", "pttl", "mget", "exists", "hgetall", "smembers", "xrevrange")
#: Seconds the server is left alone to count its reads with no page open.
IDLE_FOR = 20.0


def run(url: str, sizes: tuple[int, ...], requests: int) -> dict[str, Any]:
    """Per keyspace size: ms and Redis reads of each request kind, and idle reads/min."""
    results: dict[str, Any] = {"sizes": {}}
    for size in sizes:
        results["sizes"][size] = _at(url, size, requests if size < 1_000_000 else 3)
    results["event"] = _event_cost("dedupe:{bench.task:" + "0" * 32 + "}")
    return results


def _at(url: str, live_keys: int, requests: int) -> dict[str, Any]:
    with RedisServer() as server:
        app = make_app(url, dedupe_redis_url=server.url)
        prefix = app.conf.dedupe_key_prefix
        client = runtime_of(app).store.client
        fill = client.register_script(FILL)
        record = pack_queued(str(uuid.uuid4()), time.time(), None)
        for start in range(0, live_keys, 100_000):
            end = min(live_keys, start + 100_000)
            fill(args=[start + 1, end, f"{prefix}:{{bench.fill:", record, 3_600_000])
        running = [f"run-{n}" for n in range(3)]
        for n, task_id in enumerate(running):
            key = format_call_key(prefix, "bench.fill", f"{10**9 + n:032x}")
            client.set(key, pack_running(task_id, "t", "node", 100 + n, time.time()), px=3_600_000)
        stats = redis.Redis.from_url(server.url)
        timings: dict[str, list[float]] = {}
        reads: dict[str, list[int]] = {}
        walks: list[int] = []
        with _served(build(app)[1]) as http:
            idle = _reads(stats)
            time.sleep(IDLE_FOR)
            idle_per_minute = (_reads(stats) - idle) * 60 / IDLE_FOR
            for _ in range(requests):
                for name, measure in (
                    ("first page (200 rows)", lambda: _first(http)),
                    ("filtered page: the 3 running keys (a walk)", lambda: _running(http)),
                    ("next page (200 rows)", lambda: _next(http)),
                ):
                    before = _reads(stats)
                    started = time.perf_counter()
                    found, walked = measure()
                    timings.setdefault(name, []).append((time.perf_counter() - started) * 1000)
                    reads.setdefault(name, []).append(_reads(stats) - before)
                    if name.startswith("filtered"):
                        assert sorted(found) == running, found
                        walks.append(walked)
                    else:
                        assert len(found) >= 200, len(found)
        return {
            "live keys": live_keys + 3,
            "ms": timings,
            "reads": reads,
            "requests per walk": walks,
            "idle reads per minute": idle_per_minute,
        }


def _reads(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in READS)


#: The cursor the last first page handed back: where its next page starts.
_after_first = [0]


def _first(http: httpx.Client) -> tuple[list[str], int]:
    answer = http.get("/api/keys").raise_for_status().json()
    _after_first[0] = answer["cursor"]
    return [row["holder"] for row in answer["keys"]], 1


def _next(http: httpx.Client) -> tuple[list[str], int]:
    answer = http.get("/api/keys", params={"cursor": _after_first[0]}).raise_for_status().json()
    return [row["holder"] for row in answer["keys"]], 1


def _running(http: httpx.Client) -> tuple[list[str], int]:
    """The page's own walk: requests from the cursor until the scan is done."""
    found: list[str] = []
    cursor, walked = 0, 0
    while True:
        params = {"state": "running", "cursor": cursor}
        answer = http.get("/api/keys", params=params).raise_for_status().json()
        found += [row["holder"] for row in answer["keys"]]
        cursor, walked = answer["cursor"], walked + 1
        if cursor == 0:
            return found, walked


@contextmanager
def _served(asgi: Any) -> Iterator[httpx.Client]:
    config = uvicorn.Config(asgi, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            yield http
    finally:
        server.should_exit = True
        thread.join(15)


def _event_cost(key: str) -> dict[str, float]:
    """Microseconds per event (emit) with the recorder observing and no view running,
    against no observer at all: what the web view costs each call and run while it is off.
    Interleaved rounds, median."""

    def emit() -> None:
        events.emit(events.DEDUPLICATED, "bench.task", "id", key)

    watching = recorder.Recorder()
    watching.listening()  # (its first look made: the cost of a process that has looked)
    deadline = time.monotonic() + 10
    while not watching.looked and time.monotonic() < deadline:
        time.sleep(0.05)
    samples: dict[str, list[float]] = {"no observer": [], "recorder observing, view off": []}
    for _ in range(9):
        for name in samples:
            events.set_observer(None if name == "no observer" else watching)
            started = time.perf_counter_ns()
            for _ in range(20_000):
                emit()
            samples[name].append((time.perf_counter_ns() - started) / 20_000 / 1000)
    events.set_observer(None)
    return {name: statistics.median(values) for name, values in samples.items()}


def summary(results: dict[str, Any]) -> list[str]:
    """The report's lines."""
    lines = [
        "## Web view",
        "",
        "Per request kind: median ms (max) and Redis reads (SCAN, GET, PTTL ... from INFO "
        "commandstats) over real HTTP; the filtered page is the whole walk the page makes "
        "(every request until the cursor is 0), and checks it found the 3 running keys.",
        "",
        "| live keys | request | median ms | max ms | Redis reads | requests |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for at in results["sizes"].values():
        for name, values in at["ms"].items():
            walk = at["requests per walk"][0] if name.startswith("filtered") else 1
            lines.append(
                f"| {at['live keys']:,} | {name} | {statistics.median(values):.1f} | "
                f"{max(values):.1f} | {statistics.median(at['reads'][name]):,.0f} | {walk} |"
            )
    lines += ["", "| live keys | Redis reads per minute, no page open |", "|---:|---:|"]
    lines += [
        f"| {at['live keys']:,} | {at['idle reads per minute']:.0f} |"
        for at in results["sizes"].values()
    ]
    event = results["event"]
    lines += [
        "",
        "| an event (emit), no view running | us |",
        "|---|---:|",
        *(f"| {name} | {micros:.2f} |" for name, micros in event.items()),
        "",
    ]
    return lines
