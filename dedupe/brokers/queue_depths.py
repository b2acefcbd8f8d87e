"""Which of some calls' messages a broker other than Redis surely no longer holds: where
messages cannot be read without consuming them (RabbitMQ), only an empty queue tells. A call
whose task's queue (as the app routes it) holds no ready message, and which no live worker
holds (the reaper asks the workers apart), has no message.

A call sent with an explicit ``queue=`` or routing the app's configuration does not give is
looked for in the task's routed queue: see docs/known-limits.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from celery import Celery

from .message_search import Search

__all__ = ["routed_queue", "search_by_depth"]


def routed_queue(app: Celery, task_name: str) -> str:
    """The queue ``app`` routes a call of ``task_name`` to, given no routing options."""
    router: Any = app.amqp.router
    route: Mapping[str, Any] = router.route({}, task_name)
    queue = route.get("queue")
    return str(getattr(queue, "name", queue or app.conf.task_default_queue))


def search_by_depth(app: Celery, calls: Mapping[str, str]) -> Search:
    """Of ``calls`` (task id -> task name), those whose routed queue holds a ready message
    or cannot be asked: what may still have its message."""
    queues = {task_id: routed_queue(app, name) for task_id, name in calls.items()}
    depths: dict[str, int | None] = {}
    with app.connection_for_read() as connection:
        connection.ensure_connection(max_retries=0)
        for queue in set(queues.values()):
            depths[queue] = _depth(connection, queue)
    found = frozenset(task_id for task_id, queue in queues.items() if depths[queue] != 0)
    return Search(found, 0, len(depths))


def _depth(connection: Any, queue: str) -> int | None:
    """Ready messages in ``queue`` (0: deleted, as good as empty); None: cannot tell."""
    channel = connection.channel()
    try:
        _, count, _ = channel.queue_declare(queue=queue, passive=True)
        return int(count)
    except connection.channel_errors as exc:
        # A passive declare of a queue that is not there fails (404), and closes the channel.
        return 0 if getattr(exc, "code", None) == 404 else None
    finally:
        # (Closed already by a failed declare.)
        with contextlib.suppress(Exception):
            channel.close()
