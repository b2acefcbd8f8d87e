"""What a call of a rate-limited key sends with its push (start_publish.lua,
start_ticket_publish.lua), and what the push did."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EtaSplit", "PlaceWait", "StartPush"]


@dataclass(frozen=True, slots=True)
class EtaSplit:
    """A message serialised as kombu pushes it, but for its eta's JSON value: the text
    before it and after it, and the call's own eta's value (``null``: none)."""

    prefix: str
    own: str
    suffix: str


@dataclass(frozen=True, slots=True)
class PlaceWait:
    """How long the place in line of a call with both limits waits: ``past_start_ms`` past
    its start, cut at its message's expiry (``expiry_ms`` from now, 1 s at least; None: the
    message never expires)."""

    past_start_ms: int
    expiry_ms: int | None = None

    def ms_after(self, wait_ms: int) -> int:
        """How long the place waits, for a start ``wait_ms`` from now (as the script has it)."""
        place = self.past_start_ms + wait_ms
        return place if self.expiry_ms is None else max(min(place, self.expiry_ms), 1000)


@dataclass(frozen=True, slots=True)
class StartPush:
    """What start_publish.lua did: the ms from now to the call's start, and the JSON value
    of the eta it pushed."""

    wait_ms: int
    eta: str
