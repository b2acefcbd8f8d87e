"""celery-redbeat's ``RedBeatScheduler``, deduplicating::

celery -A proj beat -S dedupe.beat.redbeat:DedupeRedBeatScheduler
"""

from __future__ import annotations

from typing import Any

from redbeat.schedulers import RedBeatScheduler

from . import DedupeSchedulerMixin

__all__ = ["DedupeRedBeatScheduler"]


class DedupeRedBeatScheduler(DedupeSchedulerMixin, RedBeatScheduler):  # type: ignore[misc]
    """celery-redbeat's RedBeatScheduler, deduplicating."""

    def maybe_due(self, entry: Any, **kwargs: Any) -> Any:
        """RedBeat's ``maybe_due``, its "Sending due task" line logged only for a tick sent
        (see ``DedupeSchedulerMixin.apply_entry``)."""
        is_due, next_time_to_run = entry.is_due()
        if is_due:
            # (advance: RedBeat's own maybe_due sends with it, which saves the entry's run.)
            self._apply_due(entry, advance=True, **kwargs)
        return next_time_to_run
