"""The producer guard in web views: the examples run as real servers, against real workers.

Each example (FastAPI on uvicorn, Django on gunicorn) gets a real ``celery worker`` and a
real HTTP server process; requests come from a real HTTP client.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from celery import Celery

from .helpers import ROOT, ServerProcess, WorkerProcess, require, wait_for

DJANGO_SITE = ROOT / "examples" / "django_site"


def _importable(*modules: str) -> bool:
    return all(importlib.util.find_spec(module) is not None for module in modules)


@dataclass
class Site:
    framework: str
    server: ServerProcess
    worker: WorkerProcess

    def post_refresh(self, report_id: int) -> Any:
        import httpx

        return httpx.post(f"{self.server.url}/reports/{report_id}/refresh", timeout=30)

    def task(self, task_id: str) -> dict[str, Any]:
        import httpx

        body: dict[str, Any] = httpx.get(f"{self.server.url}/tasks/{task_id}", timeout=30).json()
        return body

    def wait_success(self, task_id: str) -> dict[str, Any]:
        body: dict[str, Any] = wait_for(
            lambda: (b := self.task(task_id))["state"] == "SUCCESS" and b,
            timeout=30,
            message=f"task {task_id} succeeded",
        )
        return body["result"]  # type: ignore[no-any-return]

    def received(self) -> int:
        """Messages of the report task the worker has received so far."""
        log = self.worker.tail(10**7)
        return sum(
            "Task reports.refresh_report[" in line and line.endswith("] received")
            for line in log.splitlines()
        )


@pytest.fixture(scope="module", params=["fastapi", "django"])
def site(request: pytest.FixtureRequest, redis_url: str, tmp_path_factory: Any) -> Iterator[Site]:
    framework = request.param
    if framework == "fastapi":
        require(
            _importable("fastapi", "uvicorn", "httpx"),
            "FastAPI, uvicorn or httpx is not installed (pip install -e '.[examples]')",
        )
    else:
        require(
            _importable("django", "gunicorn", "httpx"),
            "Django, gunicorn or httpx is not installed (pip install -e '.[examples]')",
        )
    env = {
        "REPORTS_REDIS_URL": redis_url,
        "REPORTS_QUEUE": f"reports-{uuid.uuid4().hex[:8]}",
        # Long enough that all of 50 simultaneous requests are answered while the first
        # run is live, also on a loaded machine (a request answered after it ended is
        # rightly accepted again).
        "REPORT_SECONDS": "3",
        "REPORTS_DB": str(tmp_path_factory.mktemp("site") / "db.sqlite3"),
    }
    pinger = Celery("pinger", broker=redis_url, set_as_current=False)
    if framework == "fastapi":
        worker = WorkerProcess(pinger, env, module="examples.fastapi_app.tasks")
        server = ServerProcess(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "examples.fastapi_app.main:api",
                "--port",
                "{port}",
                "--log-level",
                "warning",
            ],
            env,
        )
    else:
        env["PYTHONPATH"] = str(DJANGO_SITE)
        worker = WorkerProcess(pinger, env, module="reports_site")
        # gunicorn, as a Django site is served in production. (runserver listens with a
        # backlog of 10: most of 50 simultaneous connects would wait for the kernel's SYN
        # retry, 1 s then 3 s, and arrive after the run they should find.)
        server = ServerProcess(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "reports_site.wsgi",
                "--bind",
                "127.0.0.1:{port}",
                "--worker-class",
                "gthread",
                "--threads",
                "16",
                "--log-level",
                "warning",
            ],
            env,
            cwd=DJANGO_SITE,
        )
    worker.start()
    try:
        server.start(ready_path="/tasks/none")
        yield Site(framework, server, worker)
    finally:
        server.stop()
        worker.stop()
        pinger.close()


@pytest.mark.slow
def test_fifty_concurrent_refreshes_publish_one_task_that_runs_once(site: Site) -> None:
    report_id = 7
    received_before = site.received()
    start = threading.Barrier(50)

    def post(_: int) -> Any:
        start.wait()
        return site.post_refresh(report_id)

    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        responses = list(pool.map(post, range(50)))
    bodies = [response.json() for response in responses]
    ids = {body["task_id"] for body in bodies}
    # Two ids are a bug only if the second was accepted while the first was live: say when.
    assert len(ids) == 1, [site.wait_success(task_id) for task_id in ids]
    assert sorted(response.status_code for response in responses) == [200] * 49 + [202]
    assert sum(not body["deduplicated"] for body in bodies) == 1
    result = site.wait_success(bodies[0]["task_id"])
    assert result["report_id"] == report_id
    wait_for(lambda: site.received() - received_before >= 1, message="worker log")
    assert site.received() - received_before == 1  # one message reached the worker


@pytest.mark.slow
def test_refreshes_of_different_reports_run_in_parallel(site: Site) -> None:
    first, second = site.post_refresh(101), site.post_refresh(102)
    assert (first.status_code, second.status_code) == (202, 202)
    one = site.wait_success(first.json()["task_id"])
    two = site.wait_success(second.json()["task_id"])
    assert one["started"] < two["finished"]
    assert two["started"] < one["finished"]


@pytest.mark.slow
def test_a_refresh_after_the_run_ended_publishes_again(site: Site) -> None:
    first = site.post_refresh(55).json()
    site.wait_success(first["task_id"])
    wait_for(
        lambda: site.post_refresh(55).status_code == 202,
        timeout=10,
        message="a new refresh accepted once the key is free",
    )


# -- Django: settings namespace and transactions, in this process -------------------------------


@pytest.fixture(scope="module")
def django_site(redis_url: str, tmp_path_factory: Any) -> Iterator[Any]:
    require(_importable("django"), "Django is not installed (pip install -e '.[examples]')")
    from celery._state import _set_current_app, get_current_app

    saved, current = dict(os.environ), get_current_app()
    os.environ.update(
        REPORTS_REDIS_URL=redis_url,
        REPORTS_QUEUE=f"reports-{uuid.uuid4().hex[:8]}",
        REPORTS_DB=str(tmp_path_factory.mktemp("django") / "db.sqlite3"),
        DJANGO_SETTINGS_MODULE="reports_site.settings",
    )
    sys.path.insert(0, str(DJANGO_SITE))
    import django

    django.setup()
    import reports_site
    from reports import tasks

    yield reports_site.celery_app, tasks.refresh_report
    sys.path.remove(str(DJANGO_SITE))
    # Later apps in this process must not pick up Celery's Django fixup, nor Django's
    # TIME_ZONE: its settings set TZ (America/Chicago by default) and call tzset().
    os.environ.clear()
    os.environ.update(saved)
    time.tzset()
    _set_current_app(current)  # (the site's app made itself the current one)


def test_django_settings_reach_dedupe_through_the_celery_namespace(django_site: Any) -> None:
    app, refresh_report = django_site
    assert app.conf.dedupe_key_prefix == "reports"
    result = refresh_report.delay_unique(1)
    assert result.keys.call.startswith("reports:{reports.refresh_report:")


def test_a_rolled_back_transaction_claims_nothing_and_sends_nothing(
    django_site: Any, redis_client: redis.Redis
) -> None:
    from django.db import transaction

    import dedupe

    app, refresh_report = django_site

    class Rollback(Exception):
        pass

    def write_then_fail() -> None:
        with transaction.atomic():
            raise Rollback(refresh_report.apply_async_unique_on_commit((2,)))

    queued = redis_client.llen(app.conf.task_default_queue)
    with pytest.raises(Rollback) as rolled_back:
        write_then_fail()
    pending = rolled_back.value.args[0]
    assert pending.result is None
    assert dedupe.lookup(refresh_report, (2,)) is None
    assert redis_client.llen(app.conf.task_default_queue) == queued


def test_a_committed_transaction_claims_and_sends_at_commit(
    django_site: Any, redis_client: redis.Redis
) -> None:
    from django.db import transaction

    import dedupe

    app, refresh_report = django_site
    queued = redis_client.llen(app.conf.task_default_queue)
    with transaction.atomic():
        pending = refresh_report.delay_unique_on_commit(3)
        assert pending.result is None  # not before the commit
        assert dedupe.lookup(refresh_report, (3,)) is None
    assert pending.result is not None
    assert pending.result.deduplicated is False
    holder = dedupe.lookup(refresh_report, (3,))
    assert holder is not None
    assert holder.task_id == pending.result.id
    assert redis_client.llen(app.conf.task_default_queue) == queued + 1


def test_delay_on_commit_of_a_unique_django_task_is_deduplicated(
    django_site: Any, redis_client: redis.Redis
) -> None:
    from celery.contrib.django.task import DjangoTask
    from django.db import transaction

    app, refresh_report = django_site
    assert isinstance(refresh_report._get_current_object(), DjangoTask)
    queued = redis_client.llen(app.conf.task_default_queue)
    with transaction.atomic():
        refresh_report.delay_on_commit(4)  # Celery's own on-commit call, on a unique task
        refresh_report.delay_on_commit(4)
        assert redis_client.llen(app.conf.task_default_queue) == queued  # not yet
    assert redis_client.llen(app.conf.task_default_queue) == queued + 1


def test_the_example_view_answers_when_an_outer_transaction_commits_later(
    django_site: Any, redis_client: redis.Redis
) -> None:
    # ATOMIC_REQUESTS wraps the view in a transaction: the guard answers at its commit.
    import json

    from django.db import transaction
    from django.test import RequestFactory
    from reports import views

    import dedupe

    _, refresh_report = django_site
    request = RequestFactory().post("/reports/5/refresh")
    with transaction.atomic():
        response = views.refresh(request, 5)
        assert dedupe.lookup(refresh_report, (5,)) is None  # nothing claimed yet
    assert response.status_code == 202
    assert json.loads(response.content) == {"task_id": None, "on_commit": True}
    assert dedupe.lookup(refresh_report, (5,)) is not None  # claimed at the commit
