"""The events a web view shows, logged by the producers and workers that make them.

``dedupe.install`` makes the recorder :mod:`dedupe.events`' observer. It logs an event only
while a web view runs (the view's switch key is set), and asks Redis whether one does at
most every :data:`CHECK_EVERY` seconds per process: with no view running, an event costs a
clock read (see docs/web-view.md, "Cost").
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

from celery import Celery

from dedupe import events
from dedupe.runs.runtime import installed
from dedupe.store.redis_errors import redis_errors
from dedupe.store.view_log import ViewLog

__all__ = ["CHECK_EVERY", "Recorder", "connect", "watch"]

logger = logging.getLogger("dedupe.webview")

#: Seconds a process trusts its last answer to "does a web view run?".
CHECK_EVERY = 5.0

#: The installed apps, newest first: an event is logged under the app whose prefix its key has.
_apps: list[weakref.ref[Celery]] = []
_connect_lock = threading.Lock()
_connected = False
#: Counts the apps watched: a new one is asked about at its first event, not a period later.
_watched = 0


def watch(app: Celery) -> None:
    """Log ``app``'s events while a web view runs (``dedupe.install`` calls it)."""
    global _watched
    with _connect_lock:
        _apps[:] = [ref for ref in _apps if ref() is not None and ref() is not app]
        _apps.insert(0, weakref.ref(app))
        _watched += 1


def connect() -> None:
    """Make a recorder the events' observer, once per process."""
    global _connected
    with _connect_lock:
        if not _connected:
            events.set_observer(Recorder())
            _connected = True


class Recorder:
    """:class:`dedupe.events.Observer` logging events in the view's streams of their tasks."""

    def __init__(self) -> None:
        self._on = False
        self._until = 0.0
        self._watched = -1
        self._logs: weakref.WeakKeyDictionary[Celery, ViewLog] = weakref.WeakKeyDictionary()
        self._listening: set[str] = set()

    def listening(self) -> bool:
        """Does a web view run for any installed app (answered from memory for
        :data:`CHECK_EVERY` seconds)?"""
        now = time.monotonic()
        if now < self._until and self._watched == _watched:
            return self._on
        # (Set first: a Redis that is down is asked once per period, not once per event.)
        self._until, self._watched = now + CHECK_EVERY, _watched
        self._listening = {prefix for prefix, log in self._views() if _is_on(log)}
        self._on = bool(self._listening)
        return self._on

    def observe(
        self,
        event: events.Event,
        task_name: str,
        task_id: str,
        key: str,
        holder: Any,
        details: dict[str, Any],
    ) -> None:
        """Log one event in the view's stream of its task, if a view of its app runs."""
        log = next((log for prefix, log in self._views() if key.startswith(prefix + ":")), None)
        if log is None or log.prefix not in self._listening:
            return
        fields = {
            "event": event.name,
            "task_id": task_id,
            "key": key,
            "at": f"{time.time():.3f}",
            # (Only what the signals carry: ids, states, counts and error text; no arguments.)
            **{field: str(value) for field, value in details.items() if value is not None},
        }
        if holder is not None:
            fields["holder"] = str(holder.task_id)
            fields["holder_state"] = str(holder.state)
        try:
            log.record(task_name, fields, time.time())
        except redis_errors as exc:
            logger.debug("web view: event of %s not logged: %s", task_name, exc)

    def _views(self) -> list[tuple[str, ViewLog]]:
        """(key prefix, view log) of each installed app, newest first."""
        views = []
        for ref in _apps:
            app = ref()
            runtime = installed(app) if app is not None else None
            # (Never the one to make an app's store: an event of a call that could not is
            # on its way to say so.)
            store = runtime.existing_store if runtime is not None else None
            if app is None or runtime is None or store is None:
                continue
            log = self._logs.get(app)
            if log is None:
                log = self._logs[app] = ViewLog(store.client, runtime.config.key_prefix)
            views.append((runtime.config.key_prefix, log))
        return views


def _is_on(log: ViewLog) -> bool:
    try:
        return log.is_on()
    except redis_errors:
        return False
