"""``uvicorn examples.fastapi_app.main:api``"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Response

import dedupe

from .tasks import celery_app, refresh_report

api = FastAPI(title="reports")


@api.post("/reports/{report_id}/refresh")
async def refresh(report_id: int, response: Response) -> dict[str, Any]:
    """Queue a refresh, unless the same refresh is already queued or running."""
    result = await dedupe.aapply_async(refresh_report, args=(report_id,))
    response.status_code, body = dedupe.response_for(result)
    return body


@api.get("/tasks/{task_id}")
async def task_state(task_id: str) -> dict[str, Any]:
    """A task's state, and its result once it succeeded."""
    result = celery_app.AsyncResult(task_id)
    state = await asyncio.to_thread(lambda: result.state)  # a result-backend round trip
    body: dict[str, Any] = {"task_id": task_id, "state": state}
    if state == "SUCCESS":
        body["result"] = result.result
    return body
