"""Live keys by task and state for the web view, counted by a full scan in the server's
background while someone looks (``/api/stats`` was asked in the last :data:`WATCHED_FOR` s):
a request only reads the last count, so a page costs the same with 100 keys or 100,000, and
a server no browser looks at reads nothing.

The scan is the one ``celery dedupe stats`` makes (:func:`dedupe.runs.inventory.live_key_counts`);
the next one waits ten times as long as the last took (at least :data:`EVERY` seconds), so
that the view never keeps Redis scanning more than a tenth of the time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from celery import Celery

from dedupe.runs.inventory import live_key_counts

__all__ = ["EVERY", "WATCHED_FOR", "Count", "Totals", "read_again_after"]

#: The fewest seconds between two counts.
EVERY = 2.0
#: Seconds after the last request that the counts go on (a page asks every 2 s).
WATCHED_FOR = 15.0


def read_again_after(took: float, least: float) -> float:
    """Seconds before a scan that took ``took`` seconds is made again: ten times as long
    (``least`` at least), so that the view keeps Redis scanning a tenth of the time at most."""
    return max(least, 10 * took)


@dataclass(frozen=True, slots=True)
class Count:
    """One count: keys per task and state, when it was made, how long it took."""

    by_task: dict[str, dict[str, int]] = field(default_factory=dict)
    at: float | None = None
    took: float = 0.0


class Totals:
    """The last count of ``app``'s live keys (:meth:`refresh` makes a new one).

    .. code-block:: python

        totals = Totals(app)
        totals.refresh()
        totals.last.by_task  # {'reports': {'queued': 3}}
    """

    def __init__(self, app: Celery) -> None:
        self.app = app
        #: Replaced whole: a reader never sees half a count.
        self.last = Count()
        #: When a request last asked (monotonic seconds; -inf: never).
        self.wanted_at = float("-inf")

    def wanted(self) -> None:
        """Someone looks: count (again) while they do."""
        self.wanted_at = time.monotonic()

    @property
    def watched(self) -> bool:
        """Did a request come in the last :data:`WATCHED_FOR` seconds?"""
        return time.monotonic() - self.wanted_at < WATCHED_FOR

    def refresh(self) -> float:
        """Count again (raises what the scan raises: a Redis that is down); returns the
        seconds to wait before the next count."""
        started = time.monotonic()
        counts = live_key_counts(self.app)
        by_task: dict[str, dict[str, int]] = {}
        for (task, state), number in sorted(counts.items()):
            by_task.setdefault(task, {})[state] = number
        took = time.monotonic() - started
        self.last = Count(by_task, time.time(), took)
        return read_again_after(took, EVERY)
