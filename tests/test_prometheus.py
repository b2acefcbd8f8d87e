"""dedupe.prometheus: event counters by event and task, live keys read at scrape time, and
a prefork worker's children counted by its main process."""

from __future__ import annotations

import re
import socket
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from prometheus_client import REGISTRY

import dedupe
import dedupe.prometheus

from .helpers import WorkerProcess, wait_for


def counted(event: str, task: str) -> float:
    return REGISTRY.get_sample_value("dedupe_events_total", {"event": event, "task": task}) or 0.0


def live(task: str, state: str) -> float:
    return REGISTRY.get_sample_value("dedupe_live_keys", {"task": task, "state": state}) or 0.0


@pytest.fixture
def metered(make_app: Callable[..., Celery], tag: str) -> Any:
    """A unique task of an app whose metrics are enabled (a task name of this test's own)."""
    app = make_app()
    dedupe.prometheus.enable(app)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name=f"jobs.sync-{tag}")
    def sync(x: int) -> int:
        return x

    return sync


def test_calls_are_counted_by_event_and_task(metered: Any) -> None:
    metered.delay(1)
    metered.delay(1)
    metered.delay(2)
    assert counted("call_accepted", metered.name) == 2
    assert counted("call_deduplicated", metered.name) == 1


def test_the_live_keys_gauge_reads_redis_at_each_scrape(metered: Any) -> None:
    metered.delay(1)
    metered.delay(2)
    assert live(metered.name, "queued") == 2
    dedupe.clear(metered, args=(1,))
    assert live(metered.name, "queued") == 1


def test_enabling_twice_is_harmless(metered: Any) -> None:
    dedupe.prometheus.enable(metered.app)
    metered.delay(1)
    assert counted("call_accepted", metered.name) == 1
    assert live(metered.name, "queued") == 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _sample(text: str, event: str, task: str) -> float:
    pattern = rf'^dedupe_events_total\{{event="{event}",task="{re.escape(task)}"\}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@pytest.mark.slow
def test_a_prefork_workers_main_process_serves_its_childrens_counts(
    worker_app: Any, tag: str, tmp_path: Path
) -> None:
    port = _free_port()
    queue = f"metrics-{tag}"
    worker = WorkerProcess(
        worker_app.app,
        env={
            "DEDUPE_TEST_QUEUE": queue,
            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
            "DEDUPE_TEST_METRICS_PORT": str(port),
        },
    )
    worker.start()
    try:
        task = worker_app.ok
        results = [task.apply_async((f"{tag}-{n}",), queue=queue) for n in range(3)]
        for result in results:
            result.get(timeout=20)

        def scraped() -> str | None:
            url = f"http://127.0.0.1:{port}/metrics"
            text = urllib.request.urlopen(url, timeout=5).read().decode()
            return text if _sample(text, "key_released", task.name) == 3 else None

        text = wait_for(scraped, timeout=10, message="three releases counted")
        assert _sample(text, "run_claimed", task.name) == 3
    finally:
        worker.stop()
