"""WSGI entry point: ``gunicorn reports_site.wsgi`` (from examples/django_site)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reports_site.settings")

application = get_wsgi_application()
