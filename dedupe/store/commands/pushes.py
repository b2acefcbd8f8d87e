"""One call's publish held in one value, to be sent alone or with others (publish.lua,
publish_latest.lua)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dedupe.store.resp import Part, ScriptCall
from dedupe.values.keys import CallKeys
from dedupe.values.latest import LatestWrite

__all__ = ["PendingPush"]


@dataclass(frozen=True, slots=True)
class PendingPush:
    """One call's :meth:`~dedupe.store.store.Store.publish`, held back to be sent with others."""

    keys: CallKeys
    queued: bytes
    ttl_ms: int
    message: str | bytes
    lists: Sequence[str]
    provisional: bytes = b""
    expiring: Sequence[str] = ()
    expire_ms: int = 0
    force: bool = False
    #: A debounced or replacing call's: what it leaves if it is a duplicate
    #: (publish_latest.lua; None: publish.lua).
    latest: LatestWrite | None = None

    def script_call(self) -> ScriptCall:
        """The keys and arguments of publish.lua (publish_latest.lua) for this push."""
        args: list[Part] = [
            self.queued,
            self.ttl_ms,
            self.provisional,
            self.message,
            len(self.lists),
            "force" if self.force else "",
            self.expire_ms,
        ]
        if self.latest is None:
            return [self.keys.call, *self.lists, *self.expiring], args
        keys: list[Part] = [self.keys.call, self.keys.latest, *self.lists, *self.expiring]
        return keys, [*args, *self.latest.argv()]
