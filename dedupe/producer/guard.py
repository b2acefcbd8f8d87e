"""Enqueue-time dedup's entry points: a call published unless its key is live
(:func:`apply_async`, :func:`publish_unique`), a key looked up or cleared.

Every producer entry point (``DedupeTask.apply_async``, ``dedupe.apply_async``, the beat
scheduler) hands a :class:`Call` to :func:`publish_unique`, which drives a
:class:`~dedupe.producer.prepared_call.PreparedCall` through its round trips.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from celery import Celery

from dedupe.errors import RedisUnavailable
from dedupe.runs.liveness import lost_run_token
from dedupe.runs.runtime import Runtime, runtime_of
from dedupe.store.replies import Requeue
from dedupe.surfaces import TaskOrName
from dedupe.values.key_derivation import keys_for
from dedupe.values.keys import CallKeys
from dedupe.values.options import options_for
from dedupe.values.record import Holder

from .call import Call, Publish, TaskPublish, publisher_for, resolve_task
from .limited_publish import is_limited, publish_limited
from .prepared_call import PreparedCall
from .result import DedupeResult

__all__ = [
    "Call",
    "Publish",
    "TaskPublish",
    "apply_async",
    "clear",
    "keys_of_call",
    "lookup",
    "publish_prepared",
    "publish_unique",
    "publisher_for",
]


def publish_unique(call: Call) -> DedupeResult:
    """Publish a call unless its key is live: the engine behind every producer entry point."""
    return publish_prepared(PreparedCall(call))


def publish_prepared(prepared: PreparedCall) -> DedupeResult:
    """:func:`publish_unique` of a call prepared already."""
    if prepared.kind == "eager":
        return prepared.publish()
    if prepared.kind == "enqueue" and prepared.latest is None:
        # (Nothing is remembered before the store exists: never make it here, unguarded.)
        store = prepared.runtime.existing_store
        holder = store.remembered(prepared.keys) if store is not None else None
        if holder is not None:
            return prepared.duplicate(holder, remembered=True)
    if prepared.writes_first:
        store = prepared.store
        try:
            if prepared.kind == "continuation":
                token = prepared.hand_over()
                if token is None:
                    token = lost_run_token(store, prepared.keys)
                outcome: Holder | Requeue | None = store.requeue(*prepared.requeue_arguments(token))
            elif prepared.latest is not None:
                keys, provisional, ttl_ms = prepared.enqueue_arguments()
                outcome = store.enqueue_latest(keys, provisional, ttl_ms, prepared.latest)
            else:
                # A task of mostly duplicates: the duplicate's answer is remembered.
                outcome = store.enqueue(
                    *prepared.enqueue_arguments(), remember=prepared.kind == "enqueue"
                )
        except RedisUnavailable as exc:
            prepared.first_write_failed(exc)
            return prepared.publish_unrecorded()
        except BaseException:
            prepared.withdraw_first_write()
            raise
        duplicate = prepared.first_write_done(outcome)
        if duplicate is not None:
            return duplicate
    return prepared.publish_with_record()


# -- the entry points ------------------------------------------------------------------------


def apply_async(
    task_or_name: TaskOrName,
    args: Sequence[object] | None = None,
    kwargs: Mapping[str, object] | None = None,
    *,
    app: Celery | None = None,
    **options: object,
) -> DedupeResult:
    """Publish a call of any task unless the same call is already queued or running.

    The producer guard: works for a task of any base class and for a task name this
    process does not import (the ``send_task`` path). ``options`` are Celery's apply_async
    options plus ``unique_on``, ``unique_key``, ``unique_ttl``, ``unique_until``,
    ``on_duplicate``, ``debounce`` and ``debounce_max_wait``. A call of a task with
    ``key_concurrency`` or ``key_rate_limit`` is published as its ``delay`` publishes it
    (every call accepted, each in turn).

    ```python
    result = dedupe.apply_async(refresh_report, args=(42,))
    result.deduplicated                                            # False
    dedupe.apply_async("reports.refresh", args=(42,), app=app).deduplicated   # True
    ```
    """
    call = Call.of(task_or_name, args, kwargs, options, app)
    if is_limited(call):
        return publish_limited(call)  # (every call accepted, as its delay publishes it)
    return publish_unique(call)


def keys_of_call(
    task_or_name: TaskOrName,
    args: Sequence[object] | None,
    kwargs: Mapping[str, object] | None,
    app: Celery | None,
    overrides: Mapping[str, object],
) -> tuple[Runtime, CallKeys]:
    """The runtime of a call's app and the call's keys (for lookups and releases)."""
    task, name, app = resolve_task(task_or_name, app)
    runtime = runtime_of(app)
    options = options_for(task, name, runtime.config, overrides)
    return runtime, keys_for(runtime.config.key_prefix, task, name, options, args, kwargs)


def lookup(
    task_or_name: TaskOrName,
    args: Sequence[object] | None = None,
    kwargs: Mapping[str, object] | None = None,
    *,
    app: Celery | None = None,
    **overrides: object,
) -> Holder | None:
    """The task holding the key of a call (``.task_id``, ``.state``, ``.ttl``), or None.

    ```python
    holder = dedupe.lookup(refresh_report, args=(42,))
    holder.state if holder else "free"                             # 'queued'
    ```
    """
    runtime, keys = keys_of_call(task_or_name, args, kwargs, app, overrides)
    return runtime.store.lookup(keys)


def clear(
    task_or_name: TaskOrName,
    args: Sequence[object] | None = None,
    kwargs: Mapping[str, object] | None = None,
    *,
    app: Celery | None = None,
    **overrides: object,
) -> bool:
    """Force-clear the key of a call, whoever holds it. True if a key was deleted.

    A run still holding the key keeps running; its heartbeat re-creates the key.

    ```python
    dedupe.clear(refresh_report, args=(42,))                       # True
    ```
    """
    runtime, keys = keys_of_call(task_or_name, args, kwargs, app, overrides)
    return runtime.store.clear(keys)
