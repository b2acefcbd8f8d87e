"""The web view at scale: a page of keys with 100,000 live keys, over real HTTP (uvicorn in a
thread, httpx), and what the view's event log costs a call while no view runs."""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from typing import Any

import httpx
import uvicorn

from dedupe import events
from dedupe.demo.server import RedisServer
from dedupe.runs.runtime import runtime_of
from dedupe.values.record import pack_queued
from dedupe.webview import recorder
from dedupe.webview.server import build

from ._env import make_app
from .scale import FILL

#: The rare task: one key of it among the filled ones (a filter that must look far).
RARE = "bench.rare"


def run(url: str, live_keys: int, requests: int) -> dict[str, Any]:
    """Milliseconds per request of each page's call at ``live_keys`` keys, and the cost of
    an event with the recorder observing (no view running) against no observer."""
    results: dict[str, Any] = {}
    with RedisServer() as server:
        app = make_app(url, dedupe_redis_url=server.url)
        prefix = app.conf.dedupe_key_prefix
        client = runtime_of(app).store.client
        fill = client.register_script(FILL)
        record = pack_queued(str(uuid.uuid4()), time.time(), None)
        for start in range(0, live_keys, 100_000):
            end = min(live_keys, start + 100_000)
            fill(args=[start + 1, end, f"{prefix}:{{bench.fill:", record, 3_600_000])
        client.set(f"{prefix}:{{{RARE}:{'e' * 32}}}", record, px=3_600_000)
        results["live keys"] = client.dbsize()
        view, asgi = build(app)
        results["requests"] = _served(asgi, requests)
        started = time.perf_counter()
        view.totals.refresh()
        results["full count (background) ms"] = (time.perf_counter() - started) * 1000
        # (While this app's Redis runs: the recorder's cached "off" is what is timed.)
        results["event"] = _event_cost(f"{prefix}:{{bench.task:{'0' * 32}}}")
    return results


def _served(asgi: Any, requests: int) -> dict[str, list[float]]:
    config = uvicorn.Config(asgi, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    paths = {
        "/api/keys (a page of 200)": "/api/keys",
        f"/api/keys?task={RARE} (1 key in all)": f"/api/keys?task={RARE}",
        "/api/stats": "/api/stats",
        "/ (the page's HTML)": "/",
    }
    timings: dict[str, list[float]] = {name: [] for name in paths}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            for _ in range(requests):
                for name, path in paths.items():
                    started = time.perf_counter()
                    http.get(path).raise_for_status()
                    timings[name].append((time.perf_counter() - started) * 1000)
    finally:
        server.should_exit = True
        thread.join(15)
    return timings


def _event_cost(key: str) -> dict[str, float]:
    """Microseconds per event (emit) with the recorder observing and no view running,
    against no observer at all: what the web view costs each call and run while it is off.
    Interleaved rounds, median."""

    def emit() -> None:
        events.emit(events.DEDUPLICATED, "bench.task", "id", key)

    watching = recorder.Recorder()
    samples: dict[str, list[float]] = {"no observer": [], "recorder observing, view off": []}
    for _ in range(9):
        for name in samples:
            events.set_observer(None if name == "no observer" else watching)
            started = time.perf_counter_ns()
            for _ in range(20_000):
                emit()
            samples[name].append((time.perf_counter_ns() - started) / 20_000 / 1000)
    events.set_observer(watching)
    return {name: statistics.median(values) for name, values in samples.items()}


def summary(results: dict[str, Any]) -> list[str]:
    """The report's lines."""
    lines = [
        f"## Web view: {results['live keys']:,} live keys",
        "",
        "Milliseconds per HTTP request (uvicorn in a thread, httpx), "
        f"{len(next(iter(results['requests'].values())))} requests each; target: a page "
        "under 300 ms.",
        "",
        "| request | median ms | p95 ms | max ms |",
        "|---|---:|---:|---:|",
    ]
    for name, values in results["requests"].items():
        ordered = sorted(values)
        p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
        lines.append(
            f"| {name} | {statistics.median(values):.1f} | {p95:.1f} | {ordered[-1]:.1f} |"
        )
    event = results["event"]
    lines += [
        "",
        f"The totals' full count, in the server's background: "
        f"{results['full count (background) ms']:.0f} ms.",
        "",
        "| an event (emit), no view running | us |",
        "|---|---:|",
        *(f"| {name} | {micros:.2f} |" for name, micros in event.items()),
        "",
    ]
    return lines
