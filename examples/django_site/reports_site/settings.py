"""Minimal settings for the example site."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["reports"]
MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]
ROOT_URLCONF = "reports_site.urls"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("REPORTS_DB", str(BASE_DIR / "db.sqlite3")),
    }
}
USE_TZ = True

REDIS_URL = os.environ.get("REPORTS_REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("REPORTS_QUEUE", "reports")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# celery-dedupe's settings, in Celery's namespace like every other Celery setting.
CELERY_DEDUPE_KEY_PREFIX = "reports"
CELERY_DEDUPE_ON_REDIS_ERROR = "enqueue"
