"""The Celery side: one app, one report task."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

import dedupe

REDIS_URL = os.environ.get("REPORTS_REDIS_URL", "redis://127.0.0.1:6379/0")

celery_app = Celery("reports", broker=REDIS_URL, backend=REDIS_URL)
celery_app.conf.update(
    task_default_queue=os.environ.get("REPORTS_QUEUE", "reports"),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
dedupe.install(celery_app)


@celery_app.task(base=dedupe.DedupeTask, unique=True, name="reports.refresh_report")
def refresh_report(report_id: int) -> dict[str, Any]:
    """Rebuild one report (here: take REPORT_SECONDS)."""
    started = time.time()
    time.sleep(float(os.environ.get("REPORT_SECONDS", "1")))
    return {"report_id": report_id, "started": started, "finished": time.time()}
