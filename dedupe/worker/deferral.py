"""How long a run that met its key held waits before it is tried again, and how often.

A deferred run is sent again with a countdown that doubles with each deferral of its message
(``on_running_countdown`` first, then twice that, up to ``dedupe_deferral_cap``), and gives up
after ``dedupe_max_deferrals``: a holder that never lets go (a key that a restart or a stuck
worker left behind) costs a bounded number of messages, not a loop. The count travels in the
message's own header, so it survives the worker that deferred it.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["DEFERRALS", "SINCE", "backoff", "deferrals_of", "since_of"]

#: The header that counts a message's deferrals (absent: none yet).
DEFERRALS = "celery_dedupe_deferrals"
#: The header that says when a message was first deferred (the deferring host's clock):
#: a call accepted after it came while this message was already waiting.
SINCE = "celery_dedupe_since"


def deferrals_of(headers: Mapping[str, object] | None) -> int:
    """How many times this message was deferred already."""
    value = (headers or {}).get(DEFERRALS)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def since_of(headers: Mapping[str, object] | None) -> float | None:
    """When this message was first deferred (None: not yet)."""
    value = (headers or {}).get(SINCE)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def backoff(base: float, deferrals: int, cap: float) -> float:
    """Seconds before the next try of a message deferred ``deferrals`` times already.

    >>> [backoff(0.5, n, 30.0) for n in range(8)]
    [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    """
    # (min first: 2 ** a large count would overflow a float)
    return min(cap, base * float(2 ** min(deferrals, 62)))
