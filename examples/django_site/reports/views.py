from typing import Any

from celery.result import AsyncResult
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET, require_POST

import dedupe

from .tasks import refresh_report


@require_POST
def refresh(request: HttpRequest, report_id: int) -> JsonResponse:
    """Queue a refresh once the request's writes commit, unless it is already queued."""
    with transaction.atomic():
        # ... the writes the refresh depends on go here ...
        pending = refresh_report.apply_async_unique_on_commit((report_id,))
    if pending.result is None:
        # An outer transaction (ATOMIC_REQUESTS) commits after this view returns: the
        # guard answers then, and nothing is claimed or sent if it rolls back.
        return JsonResponse({"task_id": None, "on_commit": True}, status=202)
    status, body = dedupe.response_for(pending.result)
    return JsonResponse(body, status=status)


@require_GET
def task_state(request: HttpRequest, task_id: str) -> JsonResponse:
    """A task's state, and its result once it succeeded."""
    result = AsyncResult(task_id)
    body: dict[str, Any] = {"task_id": task_id, "state": result.state}
    if result.state == "SUCCESS":
        body["result"] = result.result
    return JsonResponse(body)
