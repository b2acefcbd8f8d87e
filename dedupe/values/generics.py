"""Celery's classes as bases and aliases that work on every Celery the package supports.

celery-types makes ``Task`` and ``AsyncResult`` generic for the type checker; only Celery 5.7
can subscript them at run time (5.3 to 5.6 raise ``TypeError: type 'AsyncResult' is not
subscriptable`` at import). The checker sees the generic forms, the interpreter the plain
classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from celery import Task
from celery.result import AsyncResult

__all__ = ["AnyAsyncResult", "AnyTask", "TaskOrName"]

if TYPE_CHECKING:
    AnyTask: TypeAlias = Task[Any, Any]
    AnyAsyncResult: TypeAlias = AsyncResult[Any]
else:
    AnyTask = Task
    AnyAsyncResult = AsyncResult

#: A task object (``@shared_task``'s proxy too), or the name of a task: what the producer
#: entry points take.
TaskOrName: TypeAlias = "AnyTask | str"
