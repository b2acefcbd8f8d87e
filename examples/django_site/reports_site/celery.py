"""The Celery app, configured from Django settings (``CELERY_`` namespace)."""

import os

from celery import Celery

import dedupe

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reports_site.settings")

app = Celery("reports_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
dedupe.install(app)
