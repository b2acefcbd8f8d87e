"""The worker's side of the reaper (:mod:`dedupe.runs.reaping`), a thread of its main process:

- on a broker whose unacked messages only their worker can see (RabbitMQ), it tells the
  reaper which task ids this worker holds (received, not yet acked), every few seconds;
- every ``dedupe_reap_interval`` seconds, the one worker holding the reaper's lock sweeps;
- every few seconds, it names the node of this worker's processes (``host:pid``, as running
  records name them) for the web view.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from celery import bootsteps, signals
from celery.concurrency import solo
from celery.worker import state as worker_state

from dedupe.errors import RedisUnavailable
from dedupe.recovery.held import held_requests
from dedupe.runs.reaping import APART, MAY_HOLD_UNREAD, Reaper
from dedupe.runs.runtime import Runtime, installed
from dedupe.values.keys import holds_keys, nodes_key, reaper_keys
from dedupe.values.record import HOST

__all__ = ["Reap", "ReaperThread"]

logger = logging.getLogger("dedupe.worker")

#: The longest wait between two reports of what a worker holds: a record is freed by a pass
#: at least this long (or an interval) after the one that found it, so a message received
#: between them is reported before the second.
_REPORT_CAP = APART


class ReaperThread:
    """One worker's reaper thread (``node``: its Celery node name, ``celery@host``)."""

    def __init__(self, runtime: Runtime, consumer: object, node: str) -> None:
        self._runtime = runtime
        self._consumer = consumer
        self._node = node
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dedupe-reaper", daemon=True)
        self.reaper = Reaper(runtime)
        #: What the worker held when last seen running: as its consumer closes, Celery forgets
        #: the messages it had not started (their timer entries, its reserved requests), which
        #: stay unacked on its connection until the shutdown closes it.
        self._kept: set[str] = set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def keep_held(self) -> None:
        """Note what the worker holds now (its shutdown is beginning: ``worker_shutting_down``,
        sent before the consumer closes), to go on reporting it until it lets go."""
        if _running(self._consumer):
            self._kept = self._held_ids()

    def _run(self) -> None:
        config = self._runtime.config
        interval = config.reap_interval
        every = min(_REPORT_CAP, interval / 2) if interval else _REPORT_CAP
        next_pass = time.monotonic() + interval
        while not self._stopped.wait(every):
            try:
                self._name_processes(every)
                if not self._runtime.broker.lists_unacked:
                    self._report(every)
                # A worker that stops (a warm shutdown waits for its runs) reports what it
                # holds until it lets go, and sweeps no more.
                if not _running(self._consumer):
                    continue
                # (The lock is taken, or kept, as a pass is due: its ttl spans three.)
                if interval and time.monotonic() >= next_pass and self._sweeps(interval):
                    self.reaper.sweep()
                if interval and time.monotonic() >= next_pass:
                    next_pass = time.monotonic() + self.reaper.next_pass_in(interval)
            except RedisUnavailable as exc:
                logger.debug("reaper: the dedup Redis is out of reach: %s", exc)
            except Exception as exc:
                # (A broker out of reach, most often: the next pass starts afresh.)
                logger.warning("reaper: the pass failed: %r", exc)

    def _report(self, every: float) -> None:
        if _running(self._consumer):
            ids = self._kept = self._held_ids()
        else:
            ids = self._held_ids() | self._kept
        keys = holds_keys(self._runtime.config.key_prefix, self._node)
        self._runtime.store.report_holds(keys, ids, int(3 * every * 1000))

    def _held_ids(self) -> set[str]:
        ids = {request.id for request in held_requests(self._consumer, started=True)}
        # The solo pool runs in the thread that reads the connection: during a run, what the
        # broker sends under the prefetch window waits unread, and Celery knows nothing of it.
        pool = getattr(self._consumer, "pool", None)
        if worker_state.active_requests and isinstance(pool, solo.TaskPool):
            ids.add(MAY_HOLD_UNREAD)
        return ids

    def _name_processes(self, every: float) -> None:
        pool = getattr(self._consumer, "pool", None)
        try:
            # (A prefork pool's info names its processes; solo and threads run here.)
            children = list((getattr(pool, "info", None) or {}).get("processes", []))
        except Exception:
            children = []
        nodes = {f"{HOST}:{pid}": self._node for pid in {os.getpid(), *children}}
        key = nodes_key(self._runtime.config.key_prefix)
        self._runtime.store.name_nodes(key, nodes, int(3 * every * 1000))

    def _sweeps(self, interval: float) -> bool:
        """Does this worker hold the reaper's lock (taken, or kept, now)?"""
        lock = reaper_keys(self._runtime.config.key_prefix)[0]
        ttl = 3 * max(self.reaper.next_pass_in(interval), _REPORT_CAP)
        return self._runtime.store.take_reaper(lock, self._node.encode(), int(ttl * 1000))


#: A blueprint's running state (celery.bootsteps.RUN; the type stubs lack it).
_RUN = getattr(bootsteps, "RUN", 1)


def _running(consumer: object) -> bool:
    """Is the worker's consumer still running (not closed or terminated)?"""
    state = getattr(getattr(consumer, "blueprint", None), "state", None)
    return state is None or state == _RUN


class Reap(bootsteps.StartStopStep):
    """A consumer bootstep: runs the worker's reaper thread from the consumer's start to its
    shutdown (``dedupe.install`` adds it to the app's consumer steps).

    Not to its stop: a warm shutdown stops the consumer first, then waits for the runs, its
    connection open and the messages it holds unacked (in RabbitMQ's count of no queue).
    Until the shutdown closes that connection, the worker reports them as it held them."""

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.thread: ReaperThread | None = None

    def start(self, parent: Any) -> None:
        runtime = installed(getattr(parent, "app", None))
        if runtime is None or self.thread is not None:
            return
        node = str(getattr(parent, "hostname", None) or f"pid{os.getpid()}")
        self.thread = ReaperThread(runtime, parent, node)
        self.thread.start()
        signals.worker_shutting_down.connect(self._shutting_down, weak=False)

    def _shutting_down(self, **_: object) -> None:
        if self.thread is not None:
            self.thread.keep_held()

    def shutdown(self, parent: Any) -> None:
        signals.worker_shutting_down.disconnect(self._shutting_down)
        if self.thread is not None:
            self.thread.stop()
            self.thread = None
