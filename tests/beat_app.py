"""Apps that real ``celery beat`` subprocesses run in the tests, chosen by environment.

DEDUPE_BEAT_MODE:
  registered  the beat process imports the tasks (tests.worker_app)
  names       it does not: entries are sent by task name (the send_task path)
  django      django-celery-beat's database (DEDUPE_BEAT_DB, SQLite) holds the schedule
Every mode schedules tests.worker_app.plain_sleepy(DEDUPE_BEAT_TAG, DEDUPE_BEAT_TASK_SECONDS)
every second, to DEDUPE_BEAT_QUEUE (default: the prefork worker's queue).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

import dedupe

MODE = os.environ.get("DEDUPE_BEAT_MODE", "registered")
TAG = os.environ.get("DEDUPE_BEAT_TAG", "beat")
SECONDS = float(os.environ.get("DEDUPE_BEAT_TASK_SECONDS", "3.5"))
BROKER = os.environ.get("DEDUPE_TEST_BROKER", "redis://127.0.0.1:6379/0")
REDIS = os.environ.get("DEDUPE_TEST_REDIS", BROKER)
QUEUE = os.environ.get("DEDUPE_BEAT_QUEUE", os.environ.get("DEDUPE_TEST_QUEUE", "dedupe-prefork"))

if MODE == "django":
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django_celery_beat"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": os.environ["DEDUPE_BEAT_DB"],
            }
        },
        USE_TZ=True,
        TIME_ZONE="UTC",
    )
    django.setup()

if MODE == "names":
    app = Celery("beat_names", broker=BROKER, backend=REDIS)
    app.conf.update(
        dedupe_key_prefix=os.environ.get("DEDUPE_TEST_PREFIX", "wk"),
        broker_connection_retry_on_startup=True,
    )
    dedupe.install(app)
else:
    from tests.worker_app import app

app.conf.update(
    beat_max_loop_interval=1,
    dedupe_redis_url=os.environ.get("DEDUPE_BEAT_DEDUP_REDIS", REDIS),
    redbeat_redis_url=REDIS,
    redbeat_key_prefix=f"redbeat-{TAG}:",
    redbeat_lock_timeout=10,
)
ENTRY: dict[str, Any] = {
    "task": "tests.worker_app.plain_sleepy",
    "schedule": 1.0,
    "args": (TAG, SECONDS),
    "options": {"queue": QUEUE},
}
if MODE != "django":
    app.conf.beat_schedule = {"sleepy-every-second": ENTRY}


def seed_database() -> None:
    """Create django-celery-beat's tables and the entry (DEDUPE_BEAT_MODE=django)."""
    import json

    from django.core.management import call_command
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    call_command("migrate", verbosity=0)
    every_second, _ = IntervalSchedule.objects.get_or_create(
        every=1, period=IntervalSchedule.SECONDS
    )
    PeriodicTask.objects.create(
        name="sleepy-every-second",
        task=ENTRY["task"],
        interval=every_second,
        args=json.dumps(list(ENTRY["args"])),
        queue=QUEUE,
        # A PeriodicTask carries dedup options in a header (its options are a fixed set).
        headers=json.dumps({"dedupe": {"unique_on": ["tag"]}}),
    )
