"""The chart counts every call made while a view runs, in a process that looked at the
switch before the view started too (issue 43, item 3)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery

from dedupe.webview import recorder

from .helpers import ROOT, WorkerProcess, wait_for
from .view_server import PRODUCER_APP, served_view, web_app_env

pytest.importorskip("starlette", reason="the web extra: pip install 'celery-dedupe[web]'")
pytestmark = pytest.mark.slow

# A long-running producer: one call (its recorder looks: no view), then, told to, four calls
# and four duplicates, then it stays alive until told to exit.
PRODUCER = (
    PRODUCER_APP
    + """
import sys, time
from dedupe.webview import recorder

refresh.delay("before the view")
while not recorder._recorder.looked:
    time.sleep(0.05)
print("looked", flush=True)
sys.stdin.readline()
for n in range(4):
    refresh.delay(str(n))
    refresh.delay(str(n))
print("called", flush=True)
sys.stdin.readline()
"""
)


@pytest.fixture
def view_app(make_app: Callable[..., Celery], redis_factory: Any) -> Iterator[Celery]:
    app = make_app(dedupe_redis_url=redis_factory().url, dedupe_web_events=True)
    yield app
    recorder.unwatch(app)


def test_a_process_that_looked_before_the_view_started_counts_its_calls_since(
    view_app: Celery,
) -> None:
    env = web_app_env(view_app)
    with subprocess.Popen(
        [sys.executable, "-c", PRODUCER],
        env=env,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as producer:
        try:
            _count_since_the_view(view_app, producer)
        finally:
            if producer.poll() is None:
                producer.kill()


def _count_since_the_view(view_app: Celery, producer: subprocess.Popen[str]) -> None:
    assert producer.stdin is not None
    assert producer.stdout is not None
    assert producer.stdout.readline().strip() == "looked"
    with served_view(view_app) as served:
        # Its calls right away: before its next look at the switch (every 5 s).
        producer.stdin.write("go\n")
        producer.stdin.flush()
        assert producer.stdout.readline().strip() == "called"

        def counted() -> tuple[int, int]:
            chart = served.get("/api/stats").json()["chart"].get("reports.refresh", [])
            return sum(m[1] for m in chart), sum(m[2] for m in chart)

        # (Written at its next look, while it still runs.)
        wait_for(lambda: counted() == (4, 4), timeout=3 * recorder.CHECK_EVERY)
    producer.stdin.write("exit\n")
    producer.stdin.flush()
    assert producer.wait(timeout=30) == 0


def test_a_pool_childs_last_calls_before_it_exits_are_counted(view_app: Celery) -> None:
    # One child, replaced after each task (it ends by os._exit right after its calls).
    worker = WorkerProcess(
        view_app,
        web_app_env(view_app),
        concurrency=1,
        module="tests.web_worker_app",
        extra=("--max-tasks-per-child", "1"),
    )
    with served_view(view_app) as served:
        worker.start()
        try:
            view_app.send_task("calls.four")

            def counted() -> tuple[int, int]:
                chart = served.get("/api/stats").json()["chart"].get("reports.refresh", [])
                return sum(m[1] for m in chart), sum(m[2] for m in chart)

            wait_for(lambda: counted() == (4, 4), timeout=20)
        finally:
            worker.stop(timeout=10)
