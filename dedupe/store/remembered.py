"""One thread's remembered answers: what an enqueue said of a key, kept until Redis says the
key changed (an invalidation push), for ``remember_for`` seconds at most.

An entry of None marks a key met held (asked untracked): a duplicate of it again within
``remember_for`` is worth tracking. The connection that reads the pushes is the script
runner's; this table only keeps and drops.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from dedupe.values.record import Holder

__all__ = ["MOST_REMEMBERED", "Answer", "RememberedAnswers"]

#: What an enqueue said of a key: when the holder's record expires (``time.monotonic()``),
#: and the holder.
Answer: TypeAlias = "tuple[float, Holder]"

#: Answers one thread remembers at most (each lives ``remember_for`` seconds at most).
MOST_REMEMBERED = 4096


class RememberedAnswers:
    """Key (bytes, as Redis names it in a push) -> (until, answer or None)."""

    __slots__ = ("_entries", "_remember_for")

    def __init__(self, remember_for: float) -> None:
        self._remember_for = remember_for
        self._entries: dict[bytes, tuple[float, Answer | None]] = {}

    def __bool__(self) -> bool:
        return bool(self._entries)

    def keep(self, name: bytes, until: float, value: Answer | None) -> None:
        """Remember ``value`` for ``name`` until ``until`` (time.monotonic(); capped at
        ``remember_for`` from now). A full table drops what expired, else everything (a
        burst over that many keys asks again)."""
        now = time.monotonic()
        entries = self._entries
        if len(entries) >= MOST_REMEMBERED:
            for expired in [key for key, entry in entries.items() if entry[0] <= now]:
                del entries[expired]
            if len(entries) >= MOST_REMEMBERED:
                entries.clear()
        entries[name] = (min(until, now + self._remember_for), value)

    def is_fresh(self, name: bytes) -> bool:
        """Was ``name`` kept (an answer, or met held) and not expired?"""
        entry = self._entries.get(name)
        return entry is not None and time.monotonic() < entry[0]

    def answer(self, name: bytes) -> Answer | None:
        """The answer kept for ``name``, or None (none, only met held, or expired)."""
        entry = self._entries.get(name)
        if entry is None or entry[1] is None:
            return None
        if time.monotonic() >= entry[0]:
            del self._entries[name]
            return None
        return entry[1]

    def drop(self, name: bytes) -> None:
        self._entries.pop(name, None)

    def clear(self) -> None:
        self._entries.clear()

    def hear(self, push: Sequence[Any]) -> None:
        """Drop what an invalidation push names (all of it: a FLUSHDB or FLUSHALL); other
        pushes are not ours to hear."""
        if len(push) >= 2 and push[0] == b"invalidate":
            names = push[1]
            if names is None:
                self._entries.clear()
            else:
                for name in names:
                    self._entries.pop(name, None)
