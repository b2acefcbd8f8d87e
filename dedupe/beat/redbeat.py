"""celery-redbeat's ``RedBeatScheduler``, deduplicating::

celery -A proj beat -S dedupe.beat.redbeat:DedupeRedBeatScheduler
"""

from __future__ import annotations

from redbeat.schedulers import RedBeatScheduler

from . import DedupeSchedulerMixin

__all__ = ["DedupeRedBeatScheduler"]


class DedupeRedBeatScheduler(DedupeSchedulerMixin, RedBeatScheduler):  # type: ignore[misc]
    """celery-redbeat's RedBeatScheduler, deduplicating."""
