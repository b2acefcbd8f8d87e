"""A task id's key back to queued, for its next message: a continuation (a retry, a replace),
a message that goes back to the broker, or one the prefork parent sends again."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from dedupe.errors import RedisUnavailable
from dedupe.events import UNAVAILABLE, emit
from dedupe.runs.runtime import Runtime
from dedupe.store.replies import Requeue
from dedupe.values.config import SettingReader
from dedupe.values.header import KeyHeader
from dedupe.values.keys import CallKeys
from dedupe.values.record import pack_queued
from dedupe.values.timing import milliseconds, seconds_until

__all__ = ["requeue_for_message", "requeue_key", "ttl_and_delay"]

logger = logging.getLogger("dedupe.worker")


def requeue_key(
    runtime: Runtime, keys: CallKeys, ttl: float, task_id: str, token: str, delay: float
) -> Requeue:
    """Put a task id's key back to queued for its next message, ``delay`` seconds away."""
    now = time.time()
    record = pack_queued(task_id, now, now + delay if delay else None)
    outcome = runtime.store.requeue(keys, task_id, token, record, milliseconds(ttl + delay))
    if outcome is not Requeue.QUEUED:
        logger.debug("the key of %s stays with its holder (%s)", task_id, outcome.name.lower())
    return outcome


def requeue_for_message(
    runtime: Runtime, header: KeyHeader, task_id: str, token: str, headers: Mapping[str, object]
) -> None:
    """Requeue a key for the message about to be published with ``headers``."""
    ttl, delay = ttl_and_delay(runtime, header, headers)
    try:
        requeue_key(runtime, header.keys, ttl, task_id, token, delay)
    except RedisUnavailable as exc:
        task_name = str(headers.get("task") or "")
        action = "is sent again without its key (not requeued)"
        emit(UNAVAILABLE, task_name, task_id, header.keys.call, action=action, error=exc.cause)


def ttl_and_delay(
    runtime: Runtime, header: KeyHeader, headers: Mapping[str, object]
) -> tuple[float, float]:
    """The record ttl a message's header asks for, and the seconds until its eta."""
    enable_utc = bool(_enable_utc(runtime.app))
    delay = seconds_until(headers.get("eta"), time.time(), enable_utc=enable_utc)
    return (header.ttl if header.ttl is not None else runtime.config.default_ttl), delay


_enable_utc = SettingReader("enable_utc")
