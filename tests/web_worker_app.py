"""An app whose processes keep their events for a web view: the producer scripts' and the
worker's of tests/test_web_view*.py, configured from the environment tests/view_server.py's
``web_app_env`` gives."""

from __future__ import annotations

import os

from celery import Celery

import dedupe

app = Celery("web_worker_app", broker=os.environ["WEB_BROKER"], set_as_current=False)
app.conf.update(
    task_default_queue=os.environ["WEB_QUEUE"],
    dedupe_redis_url=os.environ["WEB_STORE"],
    dedupe_key_prefix=os.environ["WEB_PREFIX"],
    dedupe_web_events=True,
    worker_hijack_root_logger=False,
)
dedupe.install(app)


@app.task(base=dedupe.DedupeTask, unique=True, name="reports.refresh")
def refresh(account: str) -> None:
    """Never run here: its calls are what is counted."""


@app.task(name="calls.four")
def call_four() -> None:
    """Four accepted calls and four duplicates, the child's last acts before it exits."""
    for n in range(4):
        refresh.delay(f"from-child-{n}")
        refresh.delay(f"from-child-{n}")
