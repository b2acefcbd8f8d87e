"""The example site. Its Celery app loads with Django, as Celery's Django guide does."""

from .celery import app as celery_app

__all__ = ["celery_app"]
