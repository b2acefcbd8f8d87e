"""A consistent answer for views that queue work through the guard, framework-neutral.

```python
status, body = dedupe.response_for(dedupe.apply_async(refresh_report, args=(42,)))
# (202, {'task_id': '5b1f...', 'deduplicated': False})
```

202 Accepted when this request published the task; for a duplicate, 200 (the work is
already under way: here is its id) or, with ``duplicate_status=409``, Conflict.
"""

from __future__ import annotations

from .surfaces import AnyAsyncResult

__all__ = ["response_for"]


def response_for(
    result: AnyAsyncResult, *, duplicate_status: int = 200
) -> tuple[int, dict[str, object]]:
    """``(status, JSON body)`` for a result returned by a dedup entry point."""
    deduplicated = bool(getattr(result, "deduplicated", False))
    body: dict[str, object] = {"task_id": result.id, "deduplicated": deduplicated}
    holder = getattr(result, "holder", None)
    if deduplicated and holder is not None:
        body["state"] = holder.state
    return (duplicate_status if deduplicated else 202), body
