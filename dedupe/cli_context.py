"""The app a ``celery -A proj dedupe ...`` command works on."""

from __future__ import annotations

import click
from celery import Celery

from .errors import NotInstalled
from .runs.runtime import add_runtime, installed

__all__ = ["installed_app", "loaded_app"]


def loaded_app(ctx: click.Context) -> Celery:
    """The ``-A`` app with the modules a worker imports (``include``, autodiscovered tasks):
    where ``dedupe.install`` or a task may be."""
    app: Celery | None = getattr(ctx.obj, "app", None)
    if app is None:
        raise click.UsageError("no Celery app: run as `celery -A proj dedupe ...`")
    app.loader.import_default_modules()
    return app


def installed_app(ctx: click.Context) -> Celery:
    """The app, installed. One that never called ``dedupe.install`` is read all the same
    (its keys may be written by producers that did; clearing them must stay possible), but
    says so on stderr: the app's producers and workers need that call too."""
    app = loaded_app(ctx)
    if installed(app) is None:
        click.echo(f"warning: {NotInstalled(str(app.main))} Reading its keys anyway.", err=True)
        add_runtime(app)
    return app
