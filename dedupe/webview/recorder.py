"""The events a web view shows, logged by the producers and workers that make them.

Only in a process whose app sets ``dedupe_web_events = True`` (off by default: no thread, no
cost) does ``dedupe.install`` make a :class:`Recorder` the observer of :mod:`dedupe.events`.
No Redis I/O is ever on a call's or a run's path: a thread of the recorder's asks each app's Redis
whether a web view runs (every :data:`CHECK_EVERY` seconds, and when an app is installed) and
writes the events kept meanwhile (every :data:`FLUSH_EVERY` seconds). An event costs a dict
and an append (see docs/web-view.md).

A process's first events come before its thread's first look: they are kept until it, then
written or dropped as it says; those of the last few seconds are kept too, so that a look
that finds a view started since writes what was made after its start. At exit (a pool
process's too), what is still kept is written: a short script's calls count too.
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
import weakref

from celery import Celery, signals

from dedupe import events
from dedupe.runs.runtime import installed
from dedupe.store.view_log import ViewLog
from dedupe.values.record import Holder

__all__ = [
    "CHECK_EVERY",
    "FLUSH_EVERY",
    "Recorder",
    "connect",
    "listening_to",
    "look_now",
    "unwatch",
    "watch",
]

logger = logging.getLogger("dedupe.webview")

#: Seconds between two looks at the apps' switches ("does a web view run?").
CHECK_EVERY = 5.0
#: Seconds an event waits, at most, to be written.
FLUSH_EVERY = 0.2
#: Events kept for writing, at most (a Redis that is down costs memory no further).
KEPT_AT_MOST = 10_000
#: Seconds a process's exit may spend writing the events it still keeps, at most.
EXIT_WRITE_FOR = 3.0
#: Seconds the events made while no view runs are kept: a view that starts meanwhile gets
#: those made since its start at the next look (every CHECK_EVERY seconds).
RECENT_FOR = CHECK_EVERY + 2.0

#: The installed apps, newest first: an event is logged under the app whose prefix its key has.
_apps: list[weakref.ref[Celery]] = []
_lock = threading.Lock()
_recorder: Recorder | None = None


def watch(app: Celery) -> None:
    """Log ``app``'s events while a web view runs (``dedupe.install`` calls it)."""
    with _lock:
        _apps[:] = [ref for ref in _apps if ref() is not None and ref() is not app]
        _apps.insert(0, weakref.ref(app))
        recorder = _recorder
    if recorder is not None:
        recorder.look_again()


def unwatch(app: Celery) -> None:
    """Keep no more of ``app``'s events (an app closed before its process ends)."""
    with _lock:
        _apps[:] = [ref for ref in _apps if ref() is not None and ref() is not app]


def connect() -> None:
    """Make a recorder the events' observer, once per process."""
    global _recorder
    with _lock:
        if _recorder is None:
            _recorder = Recorder()
            events.set_observer(_recorder)
            atexit.register(_recorder.write_at_exit)
            # (A pool process exits with os._exit, past atexit: Celery's signal comes first.)
            signals.worker_process_shutdown.connect(_written_at_exit, weak=False)


def _written_at_exit(**_: object) -> None:
    if _recorder is not None:
        _recorder.write_at_exit()


def look_now() -> None:
    """Have this process look at the switches and write what it keeps now (not at its next
    period): a view just started or stopped."""
    recorder = _recorder
    if recorder is not None:
        recorder.listening()
        recorder.look_again()


def listening_to(prefix: str) -> bool:
    """Does this process log the events of the app with ``prefix`` (a view of it runs)?"""
    recorder = _recorder
    return recorder is not None and prefix in recorder.prefixes


#: One event kept for a view's log: the app's log, the task, the fields, when it was made.
_Event = tuple[ViewLog, str, dict[str, str], float]
#: One event as it came (the observer's arguments, and when), kept while no view runs.
_Raw = tuple[events.Event, str, str, str, "Holder | None", dict[str, object], float]


class Recorder:
    """:class:`dedupe.events.Observer` keeping events for the view's streams of their tasks."""

    def __init__(self) -> None:
        #: The key prefixes of the apps a web view runs for (the thread's last look).
        self.prefixes: frozenset[str] = frozenset()
        self._kept: collections.deque[_Event] = collections.deque(maxlen=KEPT_AT_MOST)
        #: Events made before the thread's first look (which says whether a view runs).
        self._undecided: collections.deque[_Event] = collections.deque(maxlen=KEPT_AT_MOST)
        #: Events made since a look found no view (the last RECENT_FOR seconds' of them).
        self._recent: collections.deque[_Raw] = collections.deque(maxlen=KEPT_AT_MOST)
        self._looked = False
        self._deciding = threading.Lock()
        self._io = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._logs: weakref.WeakKeyDictionary[Celery, ViewLog] = weakref.WeakKeyDictionary()
        os.register_at_fork(after_in_child=self._forked)

    @property
    def looked(self) -> bool:
        """Has the thread looked at the switches once (before it, every event is kept)?"""
        return self._looked

    def listening(self) -> bool:
        """Yes: a view may start at any time, and the events made since its start count (the
        recorder's thread starts at the first event)."""
        if self._thread is None:
            self._start()
        return True

    def observe(
        self,
        event: events.Event,
        task_name: str,
        task_id: str,
        key: str,
        holder: Holder | None,
        details: dict[str, object],
    ) -> None:
        """Keep one event for the view's stream of its task, if a view of its app runs, or
        may have started since the last look."""
        raw = (event, task_name, task_id, key, holder, details, time.time())
        if self._looked and not self.prefixes:
            # No view runs: kept as it came, for RECENT_FOR seconds (a tuple and an append).
            recent = self._recent
            recent.append(raw)
            if recent[0][-1] < raw[-1] - RECENT_FOR:
                while recent and recent[0][-1] < raw[-1] - RECENT_FOR:
                    recent.popleft()
            return
        kept = self._event(raw)
        if kept is None:
            return
        if not self._looked:
            with self._deciding:
                if not self._looked:  # (the look decides; made meanwhile, it is kept now)
                    self._undecided.append(kept)
                    return
        if kept[0].prefix in self.prefixes:
            self._kept.append(kept)
        else:
            self._recent.append(raw)

    def _event(self, raw: _Raw) -> _Event | None:
        """The event ``raw`` as the view's log of its app keeps it; None: no app of ours."""
        event, task_name, task_id, key, holder, details, at = raw
        log = next((log for prefix, log in self._views() if key.startswith(prefix + ":")), None)
        if log is None:
            return None
        fields = {
            "event": event.name,
            "task_id": task_id,
            "key": key,
            "at": f"{at:.3f}",
            # (Only what the signals carry: ids, states, counts and error text; no arguments.)
            **{field: str(value) for field, value in details.items() if value is not None},
        }
        if holder is not None:
            fields["holder"] = str(holder.task_id)
            fields["holder_state"] = str(holder.state)
        return (log, task_name, fields, at)

    def write_at_exit(self) -> None:
        """Write what is still kept, looking first if no look was made (at the process's
        exit: ``atexit``), for :data:`EXIT_WRITE_FOR` seconds at most."""
        if not self._undecided and not self._kept and not self._recent:
            return
        try:
            if not self._looked or self._recent:
                self._look()  # (a view may have started since the last look)
            self._write(deadline=time.monotonic() + EXIT_WRITE_FOR)
        except Exception as exc:  # (the process exits whatever the view's log says)
            logger.debug("web view: the events kept at exit not written: %r", exc)

    def look_again(self) -> None:
        """Look at the switches now (an app was installed)."""
        self._next_look = 0.0
        self._wake.set()

    _next_look = 0.0

    def _start(self) -> None:
        with _lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="dedupe-webview-recorder", daemon=True
                )
                self._thread.start()

    def _forked(self) -> None:
        # (A child has none of its parent's threads: it starts its own at its first event.)
        self._thread, self._kept = None, collections.deque(maxlen=KEPT_AT_MOST)
        self._undecided = collections.deque(maxlen=KEPT_AT_MOST)
        self._recent = collections.deque(maxlen=KEPT_AT_MOST)
        self._looked, self.prefixes = False, frozenset()
        self._deciding, self._io = threading.Lock(), threading.Lock()
        self._wake = threading.Event()

    def _run(self) -> None:
        while True:
            try:
                # (Written first: a look that turns the log off comes after what it kept.)
                self._write()
                now = time.monotonic()
                if now >= self._next_look:
                    self._next_look = now + CHECK_EVERY
                    self._look()
                    self._write()
            except Exception:  # (a bug of ours: the recorder goes on, and so do the calls)
                logger.exception("web view: the recorder failed; it goes on")
            self._wake.wait(max(0.0, min(FLUSH_EVERY, self._next_look - time.monotonic())))
            self._wake.clear()

    def _look(self) -> None:
        """Ask each app's Redis whether a view runs, and since when; the events kept before
        the first look, and those made since a look found no view, are then written (made
        since their app's view started) or dropped."""
        since = {p: at for p, log in self._views() if (at := _on(log)) is not None}
        with self._deciding:
            newly = set(since) - self.prefixes
            self.prefixes, self._looked = frozenset(since), True
            undecided, self._undecided = self._undecided, collections.deque(maxlen=KEPT_AT_MOST)
            recent, self._recent = self._recent, collections.deque(maxlen=KEPT_AT_MOST)
            made = [e for raw in recent if newly and (e := self._event(raw)) is not None]
            written = [e for e in undecided if e[0].prefix in since] + [
                e for e in made if e[0].prefix in newly and e[3] >= since[e[0].prefix]
            ]
            # (Before any event made from now on: the order of a task's events holds.)
            written.sort(key=lambda e: e[3])
            self._kept.extendleft(reversed(written))

    def _write(self, deadline: float = float("inf")) -> None:
        with self._io:
            while self._kept and time.monotonic() < deadline:
                self._write_one(*self._kept.popleft())

    def _write_one(self, log: ViewLog, task_name: str, fields: dict[str, str], at: float) -> None:
        try:
            log.record(task_name, fields, at)
        except Exception as exc:  # (redis-py's errors, a Cluster's among them)
            logger.debug("web view: an event of %s not logged: %r", task_name, exc)

    def _views(self) -> list[tuple[str, ViewLog]]:
        """(key prefix, view log) of each installed app whose store is made, newest first."""
        views = []
        for ref in list(_apps):
            app = ref()
            runtime = installed(app) if app is not None else None
            # (Never the one to make an app's store: a call that could not says so itself.)
            store = runtime.existing_store if runtime is not None else None
            if app is None or runtime is None or store is None:
                continue
            log = self._logs.get(app)
            if log is None:
                log = self._logs[app] = ViewLog(store.client, runtime.config.key_prefix)
            views.append((log.prefix, log))
        return views


def _on(log: ViewLog) -> float | None:
    """Since when a view of ``log``'s app runs; None: none runs, or none can be asked."""
    try:
        return log.on_since()
    except Exception as exc:  # (an app's Redis out of reach, a Cluster's too: not viewed)
        logger.debug("web view: cannot ask %s whether a view runs: %r", log.prefix, exc)
        return None
