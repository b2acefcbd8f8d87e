"""The scripts' replies, read here and only here: each ``read_*`` turns one script's reply into
a result (an enum per script, or a :class:`~dedupe.Holder`) or an exception, for the sync
store and the asyncio store alike."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, TypeVar

from dedupe.errors import UnexpectedReply
from dedupe.values.latest import Latest
from dedupe.values.record import Holder

__all__ = [
    "Claim",
    "Enqueue",
    "Push",
    "Renewal",
    "Requeue",
    "Restore",
    "Take",
    "Wait",
    "decoded",
    "first_holder",
    "not_decided",
    "read_cancel",
    "read_claim",
    "read_confirm",
    "read_enqueue",
    "read_publish",
    "read_release",
    "read_renew",
    "read_requeue",
    "read_restore",
    "read_take",
    "read_wait",
    "run_id_of",
]


class Enqueue(enum.IntEnum):
    """enqueue.lua's integer replies (a held key answers with its record instead)."""

    #: Not decided: the store lost its data, and the records of the messages in flight are
    #: not restored yet (:class:`~dedupe.store.commands.base.DataLossBarrier`). Never seen outside
    #: the store.
    LOST = 0
    CREATED = 1
    #: The key holds these very bytes: redis-py sent the command again after a timeout.
    RESENT = 2


class Push(enum.IntEnum):
    """publish.lua's integer replies (a held key answers with its record instead)."""

    PUSHED = 1
    #: The key holds these very bytes: the first send of the command pushed the message.
    RESENT = 2
    #: A forced push (a canvas member) that left the holder's record alone.
    FORCED = 3


class Claim(enum.IntEnum):
    """claim.lua's integer reply (a held key answers with its record instead)."""

    CLAIMED = 1


class Renewal(enum.IntEnum):
    """renew.lua's replies."""

    #: Another task or another run holds the key now; it was left alone.
    LOST = 0
    RENEWED = 1
    #: The key was gone (Redis restarted, failed over or evicted it) and was re-created; or
    #: a call accepted since held it, and the run took it back with that call waiting in it.
    RECREATED = 2
    #: A call accepted since is still being published into the key: the next beat takes it
    #: back.
    PENDING = 3


class Wait(enum.IntEnum):
    """wait.lua's replies."""

    #: Left alone: a call being published into the key, or a run another call waits in.
    LEFT = 0
    #: The key was free and holds this task id's queued record again.
    QUEUED = 1
    #: This task id waits in the run that holds the key, and gets the key when it ends.
    WAITS = 2
    #: The key holds this task id's record already.
    OWN = 3
    #: The key held a call accepted since the loss: this task id holds it now (a restored
    #: record), that call waiting in it.
    AHEAD = 4


class Requeue(enum.IntEnum):
    """requeue.lua's replies."""

    #: Another task id holds the record: left alone.
    OTHER_TASK = 0
    QUEUED = 1
    #: Another live run of this task id (a redelivered copy) holds it: left alone.
    LIVE_RUN = 2


class Restore(enum.IntEnum):
    """restore.lua's replies."""

    #: Left alone: the key's holder is a run another call waits in already.
    LEFT = 0
    #: The key was free and holds the message's restored record.
    RESTORED = 1
    #: Restored with the call accepted since waiting in it; or the message waits in the run
    #: of another task id that holds the key.
    JOINED = 2
    #: The key holds this task id's record already.
    OWN = 3
    #: A call accepted since is still being published into the key.
    PENDING = 4
    #: unique_until="started": the message's run holds its run lock, so it runs: its call
    #: key is left as it is (a call made now goes after the run, as before the loss).
    RUNNING = 5


class Take(enum.IntEnum):
    """take_latest.lua's answer when no arguments are taken, nor looked at."""

    #: This task id's run of the delivery's retry count ended already (end_latest.lua's
    #: tombstone): the message is a redelivery (its ack was lost) and must not run again.
    ENDED = 2


_Code = TypeVar("_Code", bound=enum.IntEnum)


def _code(kind: type[_Code], script: str, reply: Any) -> _Code:
    try:
        return kind(reply)
    except ValueError:
        raise UnexpectedReply(script, reply) from None


def _granted_or_held(
    kind: type[enum.IntEnum], script: str, key: str, reply: object
) -> Holder | None:
    # A granted request answers with an integer; a held key with b"<pttl>:<record>".
    if isinstance(reply, int):
        _code(kind, script, reply)
        return None
    if not isinstance(reply, bytes):
        raise UnexpectedReply(script, reply)
    pttl, _, raw = reply.partition(b":")
    return Holder.from_raw(key, raw, int(pttl))


def read_enqueue(key: str, reply: object) -> Holder | None:
    """None: the call was accepted; else the holder it duplicates."""
    return _granted_or_held(Enqueue, "enqueue", key, reply)


def read_publish(key: str, reply: object) -> Push | Holder:
    """How the message went out, or the holder that refused it (nothing was pushed)."""
    if isinstance(reply, int):
        return _code(Push, "publish", reply)
    holder = _granted_or_held(Push, "publish", key, reply)
    assert holder is not None
    return holder


def read_confirm(reply: object) -> bool:
    """True: the record is durable; False: it was gone, or someone else's."""
    if reply not in (0, 1):
        raise UnexpectedReply("confirm", reply)
    return bool(reply)


def read_claim(key: str, reply: object) -> Holder | None:
    """None: the run claimed the key; else the holder that keeps it from running."""
    return _granted_or_held(Claim, "claim", key, reply)


def read_renew(reply: object) -> Renewal:
    return _code(Renewal, "renew", reply)


def read_wait(reply: object) -> Wait:
    return _code(Wait, "wait", reply)


def read_requeue(reply: object) -> Requeue:
    return _code(Requeue, "requeue", reply)


def read_restore(reply: object) -> Restore:
    return _code(Restore, "restore", reply)


def read_release(reply: object) -> int:
    """The number of keys deleted."""
    if not isinstance(reply, int) or not 0 <= reply <= 2:
        raise UnexpectedReply("release", reply)
    return reply


def read_cancel(reply: object) -> bool:
    """True if the queued record was deleted."""
    if reply not in (0, 1):
        raise UnexpectedReply("cancel", reply)
    return bool(reply)


def read_take(reply: object) -> Latest | Take | None:
    """What a run takes in place of its message's arguments, or looks at; None: nothing left
    for it; :attr:`Take.ENDED`: its run ended already."""
    if isinstance(reply, list) and len(reply) == 1:
        return _code(Take, "take_latest", reply[0])
    if reply is not None and not isinstance(reply, list):
        raise UnexpectedReply("take_latest", reply)
    try:
        return Latest.read(reply)
    except (TypeError, ValueError) as exc:
        raise UnexpectedReply("take_latest", reply) from exc


def first_holder(names: Sequence[str], replies: Sequence[Any]) -> Holder | None:
    """Read GET/PTTL pairs: the first key present, as a Holder."""
    for index, name in enumerate(names):
        raw = replies[2 * index]
        if raw is not None:
            return Holder.from_raw(name, raw, replies[2 * index + 1])
    return None


def run_id_of(info: object) -> bytes:
    """The ``run_id`` in an ``INFO server`` reply; empty where it has none (or INFO was
    refused: ``info`` is then the error)."""
    run = info.get("run_id", "") if isinstance(info, dict) else ""
    return str(run).encode()


def not_decided(reply: object) -> bool:
    """Is this an enqueue's answer that the store lost its data (:attr:`Enqueue.LOST`)?"""
    return isinstance(reply, int) and reply == Enqueue.LOST


def decoded(text: bytes | str) -> str:
    """A name or value Redis answered, as text (bytes that are no UTF-8 replaced: a key of
    another program's under the prefix must not stop a scan)."""
    return text.decode("utf-8", "replace") if isinstance(text, bytes) else text
