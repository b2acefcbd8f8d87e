"""Which of some task ids still have a message on the Redis broker: in a queue (any of its
priority lists) or in kombu's unacked hash, where every message a worker received and has not
acked stays. Read with LRANGE and HSCAN in chunks, never consumed.

A message moves from a queue to the unacked hash (a worker's fetch) and back (a redelivery):
the queues are read first, so a fetch meanwhile is found in the hash; a redelivery meanwhile
may be missed, which is why the reaper frees only what two passes apart both missed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection

from celery import Celery

from dedupe.compat import kombu_private

from .message_search import Search

__all__ = ["search_redis_broker"]

#: Messages read per LRANGE or HSCAN: a round trip's reply of about a megabyte.
_CHUNK = 1000

# Celery (both protocols) sets the task id as the message's correlation id; kombu writes the
# message as JSON with non-ASCII escaped, so the id is matched in that form.
_CORRELATION_ID = re.compile(rb'"correlation_id": ?"((?:[^"\\]|\\.)*)"')


def search_redis_broker(app: Celery, task_ids: Collection[str]) -> Search:
    """Which of ``task_ids`` have a message on ``app``'s Redis broker."""
    wanted = {json.dumps(task_id)[1:-1].encode(): task_id for task_id in task_ids}
    found: set[str] = set()
    read = 0
    with app.connection_for_read() as connection:
        connection.ensure_connection(max_retries=0)
        channel = connection.default_channel
        client = kombu_private.broker_client(channel)
        queues = kombu_private.bound_queues(channel)
        for queue in sorted(queues):
            for name in kombu_private.queue_lists(channel, queue):
                start = 0
                # Pushes go on the left and fetches take from the right: reading from the
                # left by index sees a message twice at worst, never misses one that stays.
                while chunk := client.lrange(name, start, start + _CHUNK - 1):
                    read += len(chunk)
                    found.update(_ids_in(chunk, wanted))
                    start += _CHUNK
        for _, entry in client.hscan_iter(kombu_private.unacked_hash(channel), count=_CHUNK):
            read += 1
            found.update(_ids_in((entry,), wanted))
    return Search(frozenset(found), read, len(queues))


def _ids_in(messages: Collection[bytes | str], wanted: dict[bytes, str]) -> set[str]:
    ids: set[str] = set()
    for message in messages:
        raw = message.encode() if isinstance(message, str) else message
        match = _CORRELATION_ID.search(raw)
        if match is not None and match.group(1) in wanted:
            ids.add(wanted[match.group(1)])
    return ids
