"""django-celery-beat's ``DatabaseScheduler``, deduplicating::

celery -A proj beat -S dedupe.beat.database:DedupeDatabaseScheduler
"""

from __future__ import annotations

from django_celery_beat.schedulers import DatabaseScheduler

from . import DedupeSchedulerMixin

__all__ = ["DedupeDatabaseScheduler"]


class DedupeDatabaseScheduler(DedupeSchedulerMixin, DatabaseScheduler):  # type: ignore[misc]
    """django-celery-beat's DatabaseScheduler, deduplicating."""
