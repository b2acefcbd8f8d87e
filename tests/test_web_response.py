"""dedupe.response_for: one answer for every view that queues work through the guard."""

from __future__ import annotations

from typing import Any

import dedupe


def test_a_published_call_is_202_with_its_task_id(redis_app: Any) -> None:
    @redis_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def refresh(report_id: int) -> None: ...

    result = refresh.delay(1)
    assert dedupe.response_for(result) == (202, {"task_id": result.id, "deduplicated": False})


def test_a_duplicate_is_200_with_the_holders_id_and_state(redis_app: Any) -> None:
    @redis_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def refresh(report_id: int) -> None: ...

    first = refresh.delay(2)
    status, body = dedupe.response_for(refresh.delay(2))
    assert status == 200
    assert body == {"task_id": first.id, "deduplicated": True, "state": "queued"}


def test_a_duplicate_can_be_answered_409(redis_app: Any) -> None:
    @redis_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def refresh(report_id: int) -> None: ...

    first = refresh.delay(3)
    status, body = dedupe.response_for(refresh.delay(3), duplicate_status=409)
    assert (status, body["task_id"]) == (409, first.id)
