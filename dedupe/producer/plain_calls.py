"""Plain calls that carry celery-dedupe's options: refused before Celery sends them.

Celery carries an option it does not know in the message's properties, so ``unique=True`` on
a task without ``base=dedupe.DedupeTask`` (declared on the task or given to the call) queues
every call and deduplicates none, without a word. :func:`refuse_plain_dedup_options` is a
task router (Celery's ``task_routes`` takes functions): Celery asks it before each publish of
an installed app, and it routes nothing, but raises :class:`~dedupe.ConfigurationError`
naming the option and what to do.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from celery import Celery

from dedupe.values.options import check_call_names, check_plain_task

__all__ = ["refuse_plain_dedup_options", "route_through"]

#: Task classes judged already: a task's declaration is checked at its first call.
_judged: weakref.WeakSet[type] = weakref.WeakSet()


def refuse_plain_dedup_options(
    name: str,
    args: Sequence[object] | None,
    kwargs: Mapping[str, object] | None,
    options: Mapping[str, Any],
    task: Any = None,
    **_: object,
) -> None:
    """Route nothing; raise :class:`~dedupe.ConfigurationError` when a plain call (of a task
    that is no DedupeTask, or of a task name) carries an option of celery-dedupe."""
    if getattr(task, "_dedupe_guards_runs", False):
        return  # a DedupeTask: its own apply_async took its options
    if task is not None and type(task) not in _judged:
        check_plain_task(type(task), name)
        _judged.add(type(task))
    check_call_names(name, options, ())


def _with_router(routes: object) -> tuple[object, ...]:
    """``task_routes`` with :func:`refuse_plain_dedup_options` first (once)."""
    if routes is None:
        listed: tuple[object, ...] = ()
    elif isinstance(routes, (list, tuple)):
        listed = tuple(routes)
    else:
        listed = (routes,)
    if refuse_plain_dedup_options in listed:
        return listed
    return (refuse_plain_dedup_options, *listed)


def route_through(app: Celery) -> None:
    """Put the router first in ``app``'s routes (once), and in the router Celery made of
    them. Its settings must be read; again each time they are (``config_from_object`` after
    ``install`` reads routes without it)."""
    routes = _with_router(app.conf.task_routes)
    if routes == app.conf.task_routes:
        return
    app.conf.task_routes = routes
    # Celery prepares the routes, and makes its router of them, once: both anew.
    amqp: Any = app.amqp  # (its router's routes are untyped in celery-types)
    amqp.flush_routes()
    amqp.router.routes = amqp.routes
