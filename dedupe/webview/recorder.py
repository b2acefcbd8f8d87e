"""The events a web view shows, logged by the producers and workers that make them.

``dedupe.install`` connects :func:`on_event` to every signal of :mod:`dedupe.events`. It logs
an event only while a web view runs (the view's switch key is set), and asks Redis whether
one does at most every :data:`CHECK_EVERY` seconds per process: with no view running, an
event costs the signal's dispatch and a clock read (see docs/web-view.md, "Cost").
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

__all__ = ["CHECK_EVERY", "connect", "on_event", "watch"]

logger = logging.getLogger("dedupe.webview")

#: Seconds a process trusts its last answer to "does a web view run?".
CHECK_EVERY = 5.0

#: The installed apps, newest first: an event is logged under the app whose prefix its key has.
_apps: list[weakref.ref[Celery]] = []
_connect_lock = threading.Lock()
_connected = False


class _Switch:
    """One app's view log and its cached switch (a stale answer lives ``CHECK_EVERY``)."""

    __slots__ = ("log", "on", "until")

    def __init__(self, log: ViewLog) -> None:
        self.log = log
        self.on = False
        self.until = 0.0

    def is_on(self) -> bool:
        now = time.monotonic()
        if now < self.until:
            return self.on
        # (Set first: a Redis that is down is asked once per period, not once per event.)
        self.until = now + CHECK_EVERY
        try:
            self.on = self.log.is_on()
        except redis_errors:
            self.on = False
        return self.on


_switches: weakref.WeakKeyDictionary[Celery, _Switch] = weakref.WeakKeyDictionary()


def watch(app: Celery) -> None:
    """Log ``app``'s events while a web view runs (``dedupe.install`` calls it)."""
    with _connect_lock:
        _apps[:] = [ref for ref in _apps if ref() is not None and ref() is not app]
        _apps.insert(0, weakref.ref(app))


def connect() -> None:
    """Connect :func:`on_event` to every dedup signal, once per process."""
    global _connected
    with _connect_lock:
        if _connected:
            return
        for name, event in events.EVENTS.items():
            event.signal.connect(on_event, weak=False, dispatch_uid=f"dedupe.webview.{name}")
        _connected = True


def on_event(
    sender: Any = None,
    *,
    signal: Any = None,
    task_name: str = "",
    task_id: str = "",
    key: str = "",
    holder: Any = None,
    **details: Any,
) -> None:
    """Log one event in the view's stream of its task, if a web view runs."""
    switch = _switch_for(key)
    if switch is None or not switch.is_on():
        return
    name = str(getattr(signal, "name", "")).removeprefix("dedupe.")
    fields = {
        "event": name,
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
        switch.log.record(task_name, fields, time.time())
    except redis_errors as exc:
        logger.debug("web view: event of %s not logged: %s", task_name, exc)


def _switch_for(key: str) -> _Switch | None:
    for ref in _apps:
        app = ref()
        runtime = installed(app) if app is not None else None
        if runtime is None or app is None:
            continue
        prefix = runtime.config.key_prefix
        if not key.startswith(prefix + ":"):
            continue
        switch = _switches.get(app)
        if switch is None:
            switch = _switches[app] = _Switch(ViewLog(runtime.store.client, prefix))
        return switch
    return None
