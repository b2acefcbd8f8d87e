"""kombu's private members that dedupe uses (see :mod:`dedupe.compat`).

Each member, and what is turned off without it: docs/design-notes.md, "dedupe.compat".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

from kombu import Connection, Producer
from kombu.transport import redis as kombu_redis

from .members import Members

__all__ = [
    "HELD_BACK",
    "MEMBERS",
    "ONE_STEP",
    "SENDER",
    "UNACKED",
    "in_kombu_batch",
    "library_errors",
    "message_priority",
    "priority_list",
    "priority_steps",
    "put",
    "put_fanout",
    "put_shadows",
    "queue_expiries",
    "unacked_deliveries",
    "unacked_messages",
    "unacked_present",
]

MEMBERS = Members("kombu")
_Channel: Any = kombu_redis.Channel
_ONE_STEP = "the one-step publish"


def _method(name: str) -> bool:
    return callable(getattr(_Channel, name, None))


ONE_STEP: bool = all(
    [
        MEMBERS.need(
            f"kombu.transport.redis.Channel.{name}",
            _ONE_STEP,
            functools.partial(_method, name),
        )
        for name in ("_put", "_put_fanout", "_q_for_pri", "_get_message_priority")
    ]
    + [
        MEMBERS.need(
            "kombu.transport.redis.Channel.global_keyprefix",
            _ONE_STEP,
            lambda: isinstance(getattr(_Channel, "global_keyprefix", None), str),
        ),
        MEMBERS.need(
            "kombu.transport.redis.Channel.priority_steps",
            _ONE_STEP,
            lambda: isinstance(getattr(_Channel, "priority_steps", None), Iterable),
        ),
    ]
)

_UNACKED = "the keys of the Redis broker's unacked messages restored after a data loss"
# (Each looked up, none cut short: a missing one is named even after another.)
_UNACKED_FOUND = [
    MEMBERS.need(
        f"kombu.transport.redis.Channel.{name}",
        _UNACKED,
        functools.partial(lambda name: isinstance(getattr(_Channel, name, None), str), name),
    )
    for name in ("unacked_key", "unacked_index_key")
]
UNACKED: bool = all(_UNACKED_FOUND)

SENDER: bool = MEMBERS.need(
    "kombu.Connection._reraise_as_library_errors",
    "the single-call sender",
    lambda: callable(getattr(Connection, "_reraise_as_library_errors", None)),
)

# (Before kombu 5.7 there is no Producer.batch, and nothing to look at.)
HELD_BACK: bool = not hasattr(Producer, "batch") or MEMBERS.need(
    "kombu.Producer._batch_local",
    "a held-back batch skipping kombu's retry wrapper",
    lambda: "_batch_local" in Producer.__init__.__code__.co_names,
)


def put_shadows(put: Callable[..., Any], put_fanout: Callable[..., Any]) -> dict[str, Any]:
    """Instance attributes that stand for the channel's ``_put`` and ``_put_fanout``."""
    return {"_put": put, "_put_fanout": put_fanout}


def priority_steps(channel: Any) -> Iterable[Any]:
    """The priorities kombu keeps a list of each queue for."""
    steps: Iterable[Any] = channel.priority_steps
    return steps


def put(channel: Any, queue: str, message: Any, **kwargs: Any) -> Any:
    """kombu's own ``_put`` of ``channel``'s class (the instance's may be shadowed)."""
    return type(channel)._put(channel, queue, message, **kwargs)


def put_fanout(channel: Any, *args: Any, **kwargs: Any) -> Any:
    """kombu's own ``_put_fanout`` of ``channel``'s class."""
    return type(channel)._put_fanout(channel, *args, **kwargs)


def message_priority(channel: Any, message: Any) -> Any:
    """The priority kombu files ``message`` under."""
    return channel._get_message_priority(message, reverse=False)


def priority_list(channel: Any, queue: str, priority: Any) -> str:
    """The Redis list of ``queue`` for ``priority``, with the channel's key prefix."""
    return str(channel.global_keyprefix + channel._q_for_pri(queue, priority))


def queue_expiries(channel: Any) -> dict[str, Any]:
    """The ``x-expires`` of each queue declared on ``channel`` (none before kombu 5.6.2)."""
    return getattr(channel, "_expires", None) or {}


def in_kombu_batch(producer: Any) -> bool | None:
    """Is ``producer`` inside kombu's ``Producer.batch()`` block? None: cannot tell."""
    if not hasattr(Producer, "batch"):
        return False
    if not HELD_BACK:
        return None
    return getattr(getattr(producer, "_batch_local", None), "current", None) is not None


def library_errors(connection: Any) -> AbstractContextManager[Any]:
    """kombu's context turning transport errors into kombu's (what Celery's send_task uses)."""
    reraise: Callable[[], AbstractContextManager[Any]] = connection._reraise_as_library_errors
    return reraise()


# -- the Redis transport's unacked messages (read by dedupe.recovery.unacked) ----------------


def unacked_messages(channel: Any) -> dict[bytes, bytes]:
    """The Redis transport's unacked hash: delivery tag -> ``[message, exchange, routing
    key]`` as JSON."""
    client = channel.client
    messages: dict[bytes, bytes] = client.hgetall(
        _named_for(client, "HGETALL", channel.unacked_key)
    )
    return messages


def unacked_deliveries(channel: Any) -> dict[bytes, float]:
    """The Redis transport's unacked index: delivery tag -> delivery time."""
    client = channel.client
    index = client.zrange(
        _named_for(client, "ZRANGE", channel.unacked_index_key), 0, -1, withscores=True
    )
    return {tag: float(score) for tag, score in index}


def unacked_present(channel: Any, tags: list[bytes]) -> list[bytes | None]:
    """The unacked hash's value for each of ``tags`` (None: acked, or given back)."""
    client = channel.client
    present: list[bytes | None] = client.hmget(
        _named_for(client, "HMGET", channel.unacked_key), tags
    )
    return present


def _named_for(client: Any, command: str, name: str) -> str:
    """``name`` as ``command`` must send it on kombu's client: with the transport's
    ``global_keyprefix`` where the client does not add it itself (it prefixes a list of the
    commands kombu sends, of which HGETALL and HMGET are not, nor ZRANGE in kombu 5.4)."""
    prefix = getattr(client, "global_keyprefix", "")
    if prefix and command not in getattr(client, "PREFIXED_SIMPLE_COMMANDS", ()):
        return f"{prefix}{name}"
    return name
