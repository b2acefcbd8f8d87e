"""A purge that frees what it purged: each message is taken off its queue one at a time (as
``celery purge`` would drop it, but read), and the queued record its key header names is
freed, if it is still that task id's and still queued (cancel.lua). A running record stays:
its run frees it as it ends."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from kombu import Queue

from dedupe.values.header import KeyedMessage

from .runtime import Runtime

__all__ = ["Purged", "purge"]

logger = logging.getLogger("dedupe.keys")


@dataclass(frozen=True, slots=True)
class Purged:
    """What a purge took off each queue, and the keys it freed."""

    messages: Counter[str] = field(default_factory=Counter)
    freed: list[str] = field(default_factory=list)


def purge(runtime: Runtime, queues: Iterable[str]) -> Purged:
    """Take every message off ``queues`` and free the records of those the library keyed."""
    done = Purged()
    with runtime.app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=1)
        channel = connection.default_channel
        for name in queues:
            queue = Queue(name).bind(channel)
            while (message := queue.get(no_ack=True)) is not None:
                done.messages[name] += 1
                key = _free(runtime, message.headers)
                if key is not None:
                    done.freed.append(key)
    return done


def _free(runtime: Runtime, headers: object) -> str | None:
    """The call key freed for a purged message with ``headers`` (None: none was)."""
    keyed = KeyedMessage.read(headers)
    if keyed is None or not runtime.store.cancel(keyed.header.keys, keyed.task_id):
        return None
    key = keyed.header.keys.call
    logger.info("%s[%s] was purged: its key %s was freed", keyed.task_name, keyed.task_id, key)
    return key
