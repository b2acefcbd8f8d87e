"""``dedupe.install(app)``: enable celery-dedupe on an app, and connect the worker's handlers.

Handlers in :mod:`dedupe.worker` (the process that runs the task: ``lifecycle``,
``run_start``, ``early_claim``, ``publish_hook``, ``release``) and
:mod:`dedupe.worker.main_process` (the prefork pool's parent) and :mod:`dedupe.worker.unrun`
(the consumer: messages dropped unrun); which signal each serves is in the design notes
(docs/design-notes.md, "dedupe.installer").
"""

from __future__ import annotations

import logging
import threading

from celery import Celery, signals

from .compat import warn_missing
from .errors import ConfigurationError
from .producer import publish_signals
from .producer.plain_calls import route_through
from .runs.runtime import add_runtime
from .values.config import DedupeConfig
from .webview import recorder
from .worker import (
    early_claim,
    lifecycle,
    main_process,
    publish_hook,
    reaper_thread,
    release,
    run_start,
    send_again,
    unrun,
)

__all__ = ["connect", "install"]

logger = logging.getLogger("dedupe.worker")

_connected = False
_connect_lock = threading.Lock()

#: DedupeTask's own methods: looked up on a task of another base, they say which base has them.
_DEDUPE_TASK_METHODS = (
    "delay_unique",
    "apply_async_unique",
    "map_unique",
    "adelay_unique",
    "aapply_async_unique",
    "amap_unique",
)


class _OnDedupeTaskOnly:
    """Put on the app's default task base: ``plain.delay_unique(...)`` raises an
    AttributeError naming the task and the fix, where Celery's says only that the attribute
    is missing. An AttributeError still, so ``hasattr`` and ``getattr(..., default)`` hold."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, task: object, owner: type | None = None) -> object:
        who = getattr(task if task is not None else owner, "name", None)
        raise AttributeError(
            f"task {who!r} has no {self.name}: its base is not dedupe.DedupeTask. Declare it "
            f"with @app.task(base=dedupe.DedupeTask, ...), or call dedupe.apply_async(task, "
            f"args=..., kwargs=...), which deduplicates a task of any base"
        )


def install(app: Celery) -> None:
    """Enable celery-dedupe on ``app``: once, where the app is made, in producers and workers.

    It connects the worker's lifecycle handlers (claim, release, requeue), and checks the
    app's dedupe settings (now if they are read already, else when Celery reads them: a
    mistake raises [`ConfigurationError`][dedupe.ConfigurationError] here, or is logged
    then and raised at the first call). Configuring the app after this call is fine. A
    private member of Celery, kombu or redis-py that dedupe relies on and this version lacks
    is named in a warning here: the shortcut that needs it is off (see the Guide, Versions).

    ```python
    app = Celery("proj", broker="redis://localhost:6379/0")
    dedupe.install(app)
    ```
    """
    warn_missing()
    add_runtime(app)
    for name in _DEDUPE_TASK_METHODS:
        if not hasattr(app.Task, name):
            setattr(app.Task, name, _OnDedupeTaskOnly(name))
    app.steps["consumer"].add(unrun.FreeUndecodable)
    app.steps["consumer"].add(unrun.FreeRevoked)
    app.steps["consumer"].add(reaper_thread.Reap)
    # Each time Celery reads the settings; now, if it has read them already.
    app.on_after_configure.connect(_on_configure, sender=app, weak=False)
    if getattr(app, "configured", False):  # (untyped in celery-types)
        route_through(app)
        _configured(app, DedupeConfig.from_app(app))
    connect()


def _on_configure(sender: Celery, **_: object) -> None:
    route_through(sender)
    # (Celery logs what a signal receiver raises as a traceback: one line says it better.)
    try:
        config = DedupeConfig.from_app(sender)
    except ConfigurationError as exc:
        logger.error("celery-dedupe on app %r: %s", sender.main, exc)
        return
    _configured(sender, config)


def _configured(app: Celery, config: DedupeConfig) -> None:
    """What the app's settings turn on: the web view's event log (``dedupe_web_events``)."""
    if config.web_events:
        recorder.watch(app)
        recorder.connect()


def connect() -> None:
    """Connect the lifecycle handlers, once per process (they serve every installed app)."""
    global _connected
    with _connect_lock:
        if _connected:
            return
        connections = (
            (signals.task_prerun, run_start.on_prerun, "prerun"),
            (signals.task_postrun, release.on_postrun, "postrun"),
            (signals.task_internal_error, early_claim.on_internal_error, "internal_error"),
            (signals.before_task_publish, publish_hook.on_publish_in_run, "before_publish"),
            (signals.before_task_publish, main_process.on_publish_in_parent, "parent_publish"),
            (signals.before_task_publish, publish_signals.on_publish_begun, "refusal_pairing"),
            (signals.task_retry, send_again.on_retry, "retry"),
            (signals.task_failure, main_process.on_failure, "failure"),
            (signals.task_revoked, main_process.on_revoked, "revoked"),
            (signals.task_unknown, unrun.on_unknown, "unknown"),
            (signals.task_rejected, unrun.on_rejected, "rejected"),
            (signals.worker_init, lifecycle.on_worker_init, "init"),
            (signals.worker_ready, lifecycle.on_worker_ready, "ready"),
            (signals.worker_process_init, lifecycle.on_process_init, "process_init"),
            (signals.worker_process_shutdown, lifecycle.on_process_shutdown, "shutdown"),
        )
        for signal, handler, name in connections:
            signal.connect(handler, weak=False, dispatch_uid=f"dedupe.{name}")
        _connected = True
