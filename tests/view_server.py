"""A web view (``celery dedupe web``'s app) served by uvicorn in a thread of the test process,
on a free port: the tests' Celery app and the served one are the same object."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn
from celery import Celery

from dedupe.webview import recorder
from dedupe.webview.app import View
from dedupe.webview.security import CLEAR_HEADER, CSRF_HEADER, served_names
from dedupe.webview.server import build

from .helpers import free_port, wait_for


@dataclass
class Served:
    url: str
    view: View

    def get(self, path: str, **kwargs: object) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10.0, **kwargs)  # type: ignore[arg-type]

    def clear(
        self, key: str, holder: str, *, token: bool = True, csrf: bool = True
    ) -> httpx.Response:
        headers = {"Origin": self.url}
        if token:
            headers[CLEAR_HEADER] = self.view.guard.clear_token
        if csrf:
            headers[CSRF_HEADER] = self.view.guard.csrf_token
        return httpx.post(
            self.url + "/api/clear", json={"key": key, "holder": holder}, headers=headers
        )


@contextmanager
def served_view(
    app: Celery,
    *,
    allow_clear: bool = False,
    refresh: float = 0.5,
    allowed_hosts: tuple[str, ...] = (),
) -> Iterator[Served]:
    hosts = served_names("127.0.0.1", allowed_hosts)
    view, asgi = build(app, allow_clear=allow_clear, refresh=refresh, hosts=hosts)
    port = free_port()
    config = uvicorn.Config(asgi, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"view-{port}", daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), message="the web view to start")
    assert server.started, "the web view did not start"
    # This process logs its events from the moment the view runs, as the thread of its
    # recorder sees (within recorder.CHECK_EVERY; a test does not wait that long).
    # (Not for an app that keeps no events: dedupe_web_events is off by default.)
    prefix = app.conf.dedupe_key_prefix
    waits_for_events = bool(app.conf.get("dedupe_web_events", False))
    if waits_for_events:
        recorder.look_now()
        wait_for(lambda: recorder.listening_to(prefix), message="the recorder to see the view")
    try:
        yield Served(f"http://127.0.0.1:{port}", view)
    finally:
        server.should_exit = True
        thread.join(15)
        if waits_for_events:
            recorder.look_now()
            wait_for(lambda: not recorder.listening_to(prefix), message="the view seen stopped")


#: The head of a producer script for a view's app (tests/test_web_view*.py): the app of
#: tests/web_worker_app.py, on the view app's broker and keys (:func:`web_app_env`), keeps its
#: events for the view, and its ``refresh`` task is unique.
PRODUCER_APP = """
import os

from tests.web_worker_app import app, refresh
"""


def web_app_env(app: Celery) -> dict[str, str]:
    """The environment of tests/web_worker_app.py on ``app``'s broker, queue and keys."""
    return {
        **os.environ,
        "WEB_BROKER": str(app.conf.broker_url),
        "WEB_QUEUE": app.conf.task_default_queue,
        "WEB_STORE": app.conf.dedupe_redis_url,
        "WEB_PREFIX": app.conf.dedupe_key_prefix,
    }
