import os
import time
from typing import Any

from celery import shared_task

from dedupe.django import DedupeDjangoTask


@shared_task(base=DedupeDjangoTask, unique=True, name="reports.refresh_report")
def refresh_report(report_id: int) -> dict[str, Any]:
    """Rebuild one report (here: take REPORT_SECONDS)."""
    started = time.time()
    time.sleep(float(os.environ.get("REPORT_SECONDS", "1")))
    return {"report_id": report_id, "started": started, "finished": time.time()}
