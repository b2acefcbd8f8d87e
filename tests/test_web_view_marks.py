"""What the web view shows beside a key: the node name of the worker running it (issue 43),
and a mark on a queued key whose message the reaper found gone (issue 40)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery

import dedupe
from dedupe.runs.reaping import Reaper
from dedupe.runs.runtime import runtime_of
from dedupe.webview import recorder

from .conftest import in_process_worker, unique_name
from .view_server import served_view

pytest.importorskip("starlette", reason="the web extra: pip install 'celery-dedupe[web]'")
pytestmark = pytest.mark.slow


@pytest.fixture
def view_app(make_app: Callable[..., Celery], redis_factory: Any) -> Iterator[Celery]:
    # (A Redis of its own, as the other web view tests: a page reads the first keys found.)
    app = make_app(
        dedupe_redis_url=redis_factory().url, dedupe_reap_interval=1, dedupe_reap_margin=1
    )
    yield app
    recorder.unwatch(app)


def test_a_key_the_reaper_found_without_its_message_is_marked(view_app: Celery) -> None:
    @view_app.task(name=unique_name("marked"), shared=False, base=dedupe.DedupeTask, unique=True)
    def echo(x: int) -> int:
        return x

    purged = echo.delay(1)
    view_app.control.purge()
    waiting = echo.delay(2)
    time.sleep(1.2)  # (past the margin)
    Reaper(runtime_of(view_app)).sweep()
    with served_view(view_app) as served:
        rows = {row["holder"]: row for row in served.get("/api/keys").json()["keys"]}
    assert rows[purged.id]["no_message"] is True
    assert rows[waiting.id]["no_message"] is False


def test_a_running_key_names_the_node_of_its_worker(view_app: Celery) -> None:
    started, finish = threading.Event(), threading.Event()

    @view_app.task(name=unique_name("named"), shared=False, base=dedupe.DedupeTask, unique=True)
    def wait() -> None:
        started.set()
        finish.wait(20)

    with in_process_worker(view_app, hostname="named@test") as worker:
        result = wait.delay()
        assert started.wait(10)
        time.sleep(1.0)  # (the worker names its processes every half interval)
        with served_view(view_app) as served:
            rows = served.get("/api/keys", params={"state": "running"}).json()["keys"]
        finish.set()
        result.get(timeout=10)
    assert [row["node"] for row in rows] == [worker.hostname]
