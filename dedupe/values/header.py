"""The message header that carries a call's keys from the producer to the worker.

The producer decides a call's keys once and writes them into the message; the worker, and
every continuation of the task id (retry, replace, a worker lost), reads them back and never
derives them again (arguments that went through a serializer no longer hash the same, and
call-level options or the ``send_task`` path would change them).

The header is namespaced: Celery merges user headers over its protocol fields. Workers read
it from ``request.headers``, never as a request attribute (in eager mode only the dict has it).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass

from .keys import CallKeys
from .options import SEPARATE_RUN_LOCK, Until, until_of

__all__ = ["HEADER", "LATEST", "KeyHeader", "KeyedMessage", "is_publishing", "publishing"]

#: The name of the header, in the message's headers.
HEADER = "celery_dedupe"
#: Present (1) in the message of a debounced or replacing call: its run takes the arguments
#: the call's duplicates left in Redis (:mod:`dedupe.values.latest`).
LATEST = "celery_dedupe_latest"


@dataclass(frozen=True, slots=True)
class KeyHeader:
    """What a message's header says about its call: decided once, by the producer.

    On the wire it is one string, ``"<until>|<ttl>|<call key>"``: a nested mapping costs
    AMQP's table encoding more than the rest of the header. (Mappings, as earlier builds
    sent them, are still read.)

    >>> keys = CallKeys.of("dedupe:{t:ab}", separate_run_lock=True)
    >>> KeyHeader(keys, "started", 60.0).encode()
    'started|60.0|dedupe:{t:ab}'
    >>> KeyHeader.read({HEADER: "started|60.0|dedupe:{t:ab}"}).keys.run
    'dedupe:{t:ab}:run'
    >>> KeyHeader.read({HEADER: {"key": "dedupe:{t:ab}", "until": "finished"}}).ttl is None
    True
    """

    keys: CallKeys
    until: Until
    #: Seconds a queued record of the call lives (None: the reader's default).
    ttl: float | None

    def encode(self) -> str:
        """The header's value (the run key follows from the call key and ``until``)."""
        ttl = "" if self.ttl is None else repr(float(self.ttl))
        return f"{self.until}|{ttl}|{self.keys.call}"

    @classmethod
    def read(cls, headers: Mapping[str, object] | None) -> KeyHeader | None:
        """The header in a message's headers, or None for a message without it."""
        header = (headers or {}).get(HEADER)
        until: object
        if isinstance(header, str):
            until, _, rest = header.partition("|")
            ttl_text, _, key = rest.partition("|")
            try:
                ttl: object = float(ttl_text) if ttl_text else None
            except ValueError:
                return None
        elif isinstance(header, Mapping) and "key" in header:
            until, key, ttl = header.get("until"), str(header["key"]), header.get("ttl")
        else:
            return None
        if not key:
            return None
        mode = until_of(until)
        return cls(
            CallKeys.of(key, separate_run_lock=mode in SEPARATE_RUN_LOCK),
            mode,
            float(ttl) if isinstance(ttl, (int, float)) else None,
        )


@dataclass(frozen=True, slots=True)
class KeyedMessage:
    """A message the library keyed, as its headers name it: what frees its record when the
    message ends unrun (dropped by a worker, purged).

    >>> KeyedMessage.read({"id": "a1", "task": "t", HEADER: "finished||dedupe:{t:ab}"}).task_name
    't'
    """

    task_name: str
    task_id: str
    header: KeyHeader

    @classmethod
    def read(cls, headers: object) -> KeyedMessage | None:
        """The keyed message of ``headers`` (None: no headers, no key header or no id)."""
        if not isinstance(headers, Mapping):
            return None
        header = KeyHeader.read(headers)
        task_id = headers.get("id")
        if header is None or not task_id:
            return None
        name = str(headers.get("shadow") or headers.get("task") or "?")
        return cls(name, str(task_id), header)


_publishing: ContextVar[bool] = ContextVar("dedupe_publishing", default=False)


class publishing:
    """Marks a publish whose header the producer guard decided itself: ``with publishing():``.

    The worker's ``before_task_publish`` handler leaves those messages alone. A class, not a
    generator context manager: every accepted call goes through it.
    """

    __slots__ = ("_reset",)

    def __enter__(self) -> None:
        self._reset = _publishing.set(True)

    def __exit__(self, *exc_info: object) -> None:
        _publishing.reset(self._reset)


def is_publishing() -> bool:
    """True inside ``with publishing():``."""
    return _publishing.get()
