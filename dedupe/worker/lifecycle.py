"""The worker's own life, in the process that runs tasks: its start refused on wrong
settings or tasks, warnings of a risk to its keys, a watch of the dedup Redis for a loss
of its data, and a pool process's owed writes landed as it exits."""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Any, cast

from celery import Celery

from dedupe.errors import ConfigurationError, DedupeError, RedisUnavailable
from dedupe.recovery.held import HeldWatch, held_requests
from dedupe.runs.line_sweep import LineSweep
from dedupe.runs.run import acks_late_leases
from dedupe.runs.runtime import Runtime, installed, pool_process_started
from dedupe.store.checks import eviction_risk
from dedupe.store.deferred import land_all
from dedupe.values.config import SettingReader
from dedupe.values.options import GUARDS_RUNS, check_plain_task
from dedupe.values.urls import cluster_target

from .early_claim import pool_accepts_in_place, sends_at_acceptance

__all__ = ["on_process_init", "on_process_shutdown", "on_worker_init", "on_worker_ready"]

logger = logging.getLogger("dedupe.worker")


def on_worker_init(sender: object = None, **_: object) -> None:
    """Refuse to start a worker whose dedupe settings or tasks are wrong (it would run every
    unique task unguarded); warn when an acks_late task's key would wait for the Redis
    broker's visibility timeout after a worker dies (:meth:`Broker.redelivery_warning
    <dedupe.brokers.broker.Broker.redelivery_warning>`)."""
    pool_accepts_in_place(getattr(sender, "pool_cls", None))
    app = getattr(sender, "app", None)
    runtime = installed(app)
    if app is None or runtime is None:
        return
    try:
        runtime.config  # noqa: B018 (reads and checks the settings)
        for name, task in app.tasks.items():
            if not getattr(task, GUARDS_RUNS, False):
                check_plain_task(type(task), name)
    except ConfigurationError as exc:
        # SystemExit passes through Celery's signal (which logs any Exception and goes on):
        # the worker stops here, with this one line on stderr.
        message = f"celery-dedupe: the worker of app {app.main!r} cannot start: {exc}"
        raise SystemExit(message) from None
    try:
        warning = runtime.broker.redelivery_warning(acks_late_leases(app, runtime.config))
    except DedupeError as exc:  # a task's options are invalid: its runs will say so
        logger.debug("no visibility check: %s", exc)
        return
    if warning:
        logger.warning(warning)


def on_worker_ready(sender: object = None, **_: object) -> None:
    """Warn at start when the dedup Redis may evict live keys; on a broker other than Redis,
    watch the dedup Redis for a loss of its data (:mod:`dedupe.recovery.held`)."""
    app = getattr(sender, "app", None)
    runtime = installed(app)
    if runtime is None:
        return
    _watch_held(runtime, sender)  # (first: a dedup Redis down at start is the watch's to see)
    _sweep_lines(runtime)
    try:
        warning = eviction_risk(runtime.store.client)
    except RedisUnavailable as exc:  # (a Cluster no node of which answers yet)
        logger.warning("cannot check the dedup Redis's eviction settings: %s", exc)
        return
    if warning:
        logger.warning(warning)


# The watch of each app's worker (one per worker process; a new one replaces it).
_held_watches: weakref.WeakKeyDictionary[Celery, HeldWatch] = weakref.WeakKeyDictionary()


def _watch_held(runtime: Runtime, consumer: object) -> None:
    # A broker that lists the unacked messages has them restored from there
    # (dedupe.recovery.unacked); a Cluster has many servers to lose data, one at a time.
    if runtime.broker.lists_unacked or cluster_target(runtime.config.redis_url):
        return
    config = runtime.config
    every = config.default_lease / 3
    try:
        client = runtime.watch_client(socket_timeout=every + 5)
    except Exception as exc:  # a watch is no reason to fail the worker's start
        logger.warning("cannot watch the dedup Redis for a loss of its data: %r", exc)
        return
    watch = HeldWatch(
        runtime.store,
        cast("Any", client),
        prefix=config.key_prefix,
        default_ttl=config.default_ttl,
        every=every,
        held=functools.partial(held_requests, consumer),
        enable_utc=bool(_enable_utc(runtime.app)),
    )
    previous = _held_watches.get(runtime.app)
    if previous is not None:
        previous.stop()
    _held_watches[runtime.app] = watch
    watch.start()


# The look at each app's lines (one per worker; a new one replaces it).
_line_sweeps: weakref.WeakKeyDictionary[Celery, LineSweep] = weakref.WeakKeyDictionary()


def _sweep_lines(runtime: Runtime) -> None:
    previous = _line_sweeps.get(runtime.app)
    if previous is not None:
        previous.stop()
    sweep = _line_sweeps[runtime.app] = LineSweep(runtime)
    try:
        sweep.start()
    except DedupeError as exc:  # (a Cluster no node of which answers yet)
        logger.warning("no look at the lines of key_concurrency keys: %s", exc)


def on_process_init(**_: object) -> None:
    """``worker_process_init``: a prefork pool's process does not spin on the dedup Redis's
    replies unless ``dedupe_busy_poll_us`` is set. The pool's processes (Celery's default,
    one per CPU) keep the cores busy: a spin takes the CPU that a sibling, the pool's parent
    or a Redis on the same host would use, and the process sleeps in the read instead.
    (Celery's solo pool sends the signal too, in the worker's own process: that one polls.)"""
    if not sends_at_acceptance():
        pool_process_started()


def on_process_shutdown(**_: object) -> None:
    """``worker_process_shutdown``: a pool process about to exit (``os._exit``: no atexit)
    lands the releases it sent."""
    land_all()


_enable_utc = SettingReader("enable_utc")
