"""``dedupe.install(app)``: enable celery-dedupe on an app, and connect the worker's handlers.

Handlers in :mod:`dedupe.worker.execution` (the process that runs the task) and
:mod:`dedupe.worker.main_process` (the prefork pool's parent):

Design notes: docs/design-notes.md, "dedupe.installer".
"""

from __future__ import annotations

import threading

from celery import Celery, signals

from .runs.runtime import add_runtime
from .worker import execution as worker
from .worker import main_process as prefork_parent

__all__ = ["connect", "install"]

_connected = False
_connect_lock = threading.Lock()


def install(app: Celery) -> None:
    """Enable celery-dedupe on ``app``: once, where the app is made, in producers and workers.

    It connects the worker's lifecycle handlers (claim, release, requeue) and nothing else:
    settings are read on first use, so configuring the app after this call is fine.

    .. code-block:: python

        app = Celery("proj", broker="redis://localhost:6379/0")
        dedupe.install(app)
    """
    add_runtime(app)
    connect()


def connect() -> None:
    """Connect the lifecycle handlers, once per process (they serve every installed app)."""
    global _connected
    with _connect_lock:
        if _connected:
            return
        connections = (
            (signals.task_prerun, worker.on_prerun, "prerun"),
            (signals.task_postrun, worker.on_postrun, "postrun"),
            (signals.before_task_publish, worker.on_before_publish, "before_publish"),
            (signals.before_task_publish, prefork_parent.on_before_publish, "parent_publish"),
            (signals.task_failure, prefork_parent.on_failure, "failure"),
            (signals.task_revoked, prefork_parent.on_revoked, "revoked"),
            (signals.worker_init, worker.on_worker_init, "init"),
            (signals.worker_ready, worker.on_worker_ready, "ready"),
        )
        for signal, handler, name in connections:
            signal.connect(handler, weak=False, dispatch_uid=f"dedupe.{name}")
        _connected = True
