"""Worker side, in the consumer (the worker's main process): keys of messages that end without
running.

Celery drops a message it will not run: a task it does not know (``task_unknown``), content
it does not accept or a message it cannot read, such as an eta (``task_rejected``), a body it
cannot decode (the consumer's decode-error path, no signal: :class:`FreeUndecodable`), a
message revoked while it waits in the worker (``task_revoked`` comes only when the worker
reaches it: :class:`FreeRevoked`). Each frees that message's queued record at once: its own
task id's, never a running record, never another call's.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from kombu.exceptions import ContentDisallowed

from dedupe.compat.celery_private import after_decode_errors, after_revokes
from dedupe.errors import RedisUnavailable
from dedupe.events import UNAVAILABLE, emit
from dedupe.runs.runtime import installed
from dedupe.values.header import KeyedMessage

__all__ = ["FreeRevoked", "FreeUndecodable", "on_rejected", "on_unknown"]

logger = logging.getLogger("dedupe.keys")


def on_unknown(sender: Any = None, message: Any = None, **_: Any) -> None:
    """``task_unknown``: the worker does not know the message's task."""
    _free(sender, message, "unregistered task")


def on_rejected(sender: Any = None, message: Any = None, exc: Any = None, **_: Any) -> None:
    """``task_rejected``: content the worker does not accept, or a message it cannot read."""
    _free(sender, message, _why_rejected(exc))


class FreeUndecodable(bootsteps.Step):
    """A consumer bootstep: frees the key of each message whose body the worker cannot
    decode (``dedupe.install`` adds it to the app's consumer steps)."""

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        after_decode_errors(parent, lambda message, exc: _free(parent, message, "undecodable body"))


class FreeRevoked(bootsteps.Step):
    """A consumer bootstep: after each ``revoke`` command, frees the key of each revoked
    message that waits in the worker, not started (``dedupe.install`` adds it to the app's
    consumer steps)."""

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        after_revokes(_free_revoked)


def _free_revoked(consumer: Any, requests: list[Any]) -> None:
    for request in requests:
        _free(consumer, request.message, "revoked")


def _why_rejected(exc: BaseException | None) -> str:
    if isinstance(exc, ContentDisallowed):
        return "content not accepted"
    if exc is None:
        return "a message of no known format"
    # (Celery's InvalidTaskError says which header it could not read.)
    text = str(exc)
    if text.startswith("invalid ETA"):
        return "invalid eta"
    if text.startswith("invalid expires"):
        return "invalid expires"
    return f"invalid message: {text}"


def _free(consumer: Any, message: Any, why: str) -> None:
    """Free the queued record of ``message``, dropped by ``consumer`` for ``why``; one line
    says so when a record went."""
    keyed = KeyedMessage.read(getattr(message, "headers", None))
    runtime = installed(getattr(consumer, "app", None))
    if keyed is None or runtime is None:
        return
    name, task_id, key = keyed.task_name, keyed.task_id, keyed.header.keys.call
    try:
        freed = runtime.store.cancel(keyed.header.keys, task_id)
    except RedisUnavailable as exc:
        action = f"was dropped unrun ({why}); its key was not freed (its ttl frees it)"
        emit(UNAVAILABLE, name, task_id, key, action=action, error=exc.cause)
        return
    if freed:
        logger.warning(
            "%s[%s] was dropped unrun (%s): its key %s was freed", name, task_id, why, key
        )
