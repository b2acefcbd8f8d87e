"""Django: deduplicated calls that wait for the transaction, and Celery's DjangoTask.

Settings come through Celery's usual namespace (``CELERY_DEDUPE_REDIS_URL``, ...) when the
app loads them with ``app.config_from_object("django.conf:settings", namespace="CELERY")``.

More, with examples: the docs' API reference, dedupe.django.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

from django.db import transaction

from .producer.guard import apply_async
from .surfaces import AnyAsyncResult, TaskOrName
from .task import DedupeTask

try:
    from celery.contrib.django.task import DjangoTask
except ImportError as exc:  # Celery < 5.4
    raise ImportError(
        "dedupe.django needs Celery 5.4 or newer (for celery.contrib.django.task.DjangoTask): "
        "pip install 'celery>=5.4'. The rest of celery-dedupe works with Celery 5.3."
    ) from exc

__all__ = ["DedupeDjangoTask", "OnCommit", "apply_async_on_commit"]

# Generic for the type checker only: Celery before 5.7 cannot subscript it at run time.
if TYPE_CHECKING:
    _DjangoTask: TypeAlias = DjangoTask[Any, Any]
else:
    _DjangoTask = DjangoTask


class OnCommit:
    """A deduplicated call waiting for its transaction to commit.

    ``result`` is None until then (and stays None if the transaction rolls back); after the
    commit it is the call's result, with ``deduplicated`` as usual.
    """

    def __init__(self) -> None:
        self.result: AnyAsyncResult | None = None

    @property
    def committed(self) -> bool:
        return self.result is not None

    def _schedule(self, call: Callable[[], AnyAsyncResult], using: str | None) -> OnCommit:
        def run() -> None:
            self.result = call()

        transaction.on_commit(run, using=using)
        return self


def apply_async_on_commit(
    task_or_name: TaskOrName,
    args: Sequence[object] | None = None,
    kwargs: Mapping[str, object] | None = None,
    *,
    using: str | None = None,
    **options: Any,
) -> OnCommit:
    """[`dedupe.apply_async`][dedupe.apply_async] when the current transaction commits (at
    once outside one)."""
    call = functools.partial(apply_async, task_or_name, args, kwargs, **options)
    return OnCommit()._schedule(call, using)


class DedupeDjangoTask(DedupeTask, _DjangoTask):
    """[`DedupeTask`][dedupe.DedupeTask] and Celery's ``DjangoTask`` in one base class.

    ``delay_on_commit`` and ``apply_async_on_commit`` keep Celery's meaning (deduplicated
    too when the task is ``unique``); the ``*_unique_on_commit`` methods deduplicate always
    and return an [`OnCommit`][dedupe.django.OnCommit] handle.
    """

    def delay_unique_on_commit(self, *args: object, **kwargs: object) -> OnCommit:
        """``delay_unique`` when the current transaction commits."""
        return OnCommit()._schedule(functools.partial(self.delay_unique, *args, **kwargs), None)

    def apply_async_unique_on_commit(
        self,
        args: Sequence[object] | None = None,
        kwargs: Mapping[str, object] | None = None,
        *,
        using: str | None = None,
        **options: Any,
    ) -> OnCommit:
        """``apply_async_unique`` when the current transaction commits."""
        call = functools.partial(self.apply_async_unique, args, kwargs, **options)
        return OnCommit()._schedule(call, using)
