"""kombu's private members that dedupe uses (see :mod:`dedupe.compat`).

Each member, and what is turned off without it: docs/design-notes.md, "dedupe.compat".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypedDict

import redis
from kombu import Connection, Producer
from kombu.transport import redis as kombu_redis

from .members import Members

__all__ = [
    "HELD_BACK",
    "MEMBERS",
    "ONE_STEP",
    "QUEUES",
    "SENDER",
    "UNACKED",
    "bound_queues",
    "broker_client",
    "in_kombu_batch",
    "library_errors",
    "message_priority",
    "priority_list",
    "priority_steps",
    "put",
    "put_fanout",
    "put_shadows",
    "queue_expiries",
    "queue_lists",
    "unacked_deliveries",
    "unacked_hash",
    "unacked_messages",
    "unacked_present",
]

MEMBERS = Members("kombu")
_Channel = kombu_redis.Channel
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

_QUEUES = "the reaper's look into the Redis broker's queues"
# (Each looked up, none cut short: a missing one is named even after another.)
_QUEUES_FOUND = [
    MEMBERS.need(
        "kombu.transport.redis.Channel.keyprefix_queue",
        _QUEUES,
        lambda: "%s" in str(getattr(_Channel, "keyprefix_queue", "")),
    ),
    MEMBERS.need(
        "kombu.transport.redis.Channel._q_for_pri", _QUEUES, lambda: _method("_q_for_pri")
    ),
]
QUEUES: bool = UNACKED and all(_QUEUES_FOUND)

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


#: The message dict a kombu virtual channel builds and hands ``basic_publish`` and ``_put``.
KombuMessage = TypedDict(
    "KombuMessage",
    {
        "body": "str | bytes",
        "content-encoding": str,
        "content-type": str,
        "headers": "dict[str, object]",
        "properties": "dict[str, object]",
    },
)

#: A queue's priority as kombu files messages under it (one of its ``priority_steps``).
Priority = int


class RedisChannel(Protocol):
    """kombu's Redis transport's channel, as far as dedupe reads it (private members
    included: they are read here alone)."""

    global_keyprefix: str
    priority_steps: list[Priority]

    @property
    def pool(self) -> redis.ConnectionPool: ...

    def basic_publish(
        self, message: KombuMessage, exchange: str, routing_key: str, **kwargs: object
    ) -> object: ...

    def _put(self, queue: str, message: KombuMessage, **kwargs: object) -> object: ...

    def _put_fanout(self, *args: object, **kwargs: object) -> object: ...

    def _get_message_priority(self, message: KombuMessage, reverse: bool = False) -> Priority: ...

    def _q_for_pri(self, queue: str, pri: Priority) -> str: ...


def put_shadows(
    put: Callable[..., object], put_fanout: Callable[..., object]
) -> dict[str, Callable[..., object]]:
    """Instance attributes that stand for the channel's ``_put`` and ``_put_fanout``."""
    return {"_put": put, "_put_fanout": put_fanout}


def priority_steps(channel: RedisChannel) -> Iterable[Priority]:
    """The priorities kombu keeps a list of each queue for."""
    steps: Iterable[Priority] = channel.priority_steps
    return steps


def put(channel: RedisChannel, queue: str, message: KombuMessage, **kwargs: object) -> object:
    """kombu's own ``_put`` of ``channel``'s class (the instance's may be shadowed)."""
    return type(channel)._put(channel, queue, message, **kwargs)


def put_fanout(channel: RedisChannel, *args: object, **kwargs: object) -> object:
    """kombu's own ``_put_fanout`` of ``channel``'s class."""
    return type(channel)._put_fanout(channel, *args, **kwargs)


def message_priority(channel: RedisChannel, message: KombuMessage) -> Priority:
    """The priority kombu files ``message`` under."""
    return channel._get_message_priority(message, reverse=False)


def priority_list(channel: RedisChannel, queue: str, priority: Priority) -> str:
    """The Redis list of ``queue`` for ``priority``, with the channel's key prefix."""
    return str(channel.global_keyprefix + channel._q_for_pri(queue, priority))


def queue_expiries(channel: RedisChannel) -> dict[str, int]:
    """The ``x-expires`` of each queue declared on ``channel`` (none before kombu 5.6.2)."""
    expiries: dict[str, int] = getattr(channel, "_expires", None) or {}
    return expiries


def in_kombu_batch(producer: object) -> bool | None:
    """Is ``producer`` inside kombu's ``Producer.batch()`` block? None: cannot tell."""
    if not hasattr(Producer, "batch"):
        return False
    if not HELD_BACK:
        return None
    return getattr(getattr(producer, "_batch_local", None), "current", None) is not None


def library_errors(connection: Any) -> AbstractContextManager[None]:
    """kombu's context turning transport errors into kombu's (what Celery's send_task uses)."""
    # (celery-types declares the method a generator: it is a context manager.)
    reraise: Callable[[], AbstractContextManager[None]] = connection._reraise_as_library_errors
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


# -- the Redis transport's queues (read by dedupe.brokers.redis_messages) ------------------

#: What a queue's binding in kombu's ``_kombu.binding.<exchange>`` set ends with.
_BINDING_SEPARATOR = "\x06\x16"


def broker_client(channel: Any) -> redis.Redis:
    """A client on the connections of kombu's channel that sends every name as given (kombu's
    own prefixes some commands with ``global_keyprefix``, not others): full names only."""
    return redis.Redis(connection_pool=channel.client.connection_pool)


def key_prefix(channel: Any) -> str:
    """The transport's ``global_keyprefix`` ("" without one)."""
    return str(getattr(channel.client, "global_keyprefix", "") or "")


def bound_queues(channel: Any) -> set[str]:
    """The name of every queue bound on the Redis broker (of every exchange): kombu keeps a
    set per exchange whose members end with the queue's name. A deleted queue is in none."""
    client = broker_client(channel)
    pattern = f"{key_prefix(channel)}{channel.keyprefix_queue % ('*',)}"
    queues: set[str] = set()
    for table in client.scan_iter(match=pattern, count=1000):
        for member in client.smembers(table):
            text = member.decode() if isinstance(member, bytes) else str(member)
            queues.add(text.rsplit(_BINDING_SEPARATOR, 1)[-1])
    queues.discard("")
    return queues


def queue_lists(channel: Any, queue: str) -> list[str]:
    """The Redis lists that hold ``queue``'s messages, one per priority, full names."""
    names = {channel._q_for_pri(queue, priority) for priority in channel.priority_steps}
    return [f"{key_prefix(channel)}{name}" for name in sorted(names)]


def unacked_hash(channel: Any) -> str:
    """The full name of the Redis transport's unacked hash."""
    return f"{key_prefix(channel)}{channel.unacked_key}"


def _named_for(client: Any, command: str, name: str) -> str:
    """``name`` as ``command`` must send it on kombu's client: with the transport's
    ``global_keyprefix`` where the client does not add it itself (it prefixes a list of the
    commands kombu sends, of which HGETALL and HMGET are not, nor ZRANGE in kombu 5.4)."""
    prefix = getattr(client, "global_keyprefix", "")
    if prefix and command not in getattr(client, "PREFIXED_SIMPLE_COMMANDS", ()):
        return f"{prefix}{name}"
    return name
