"""Per-app runtime (settings, Redis store, heartbeat) and :func:`install`."""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from typing import Any

import redis
from celery import Celery
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from .async_store import AsyncStore
from .config import DedupeConfig
from .errors import NotInstalled
from .heartbeat import Heartbeat
from .store import Store

__all__ = ["Runtime", "install", "installed", "runtime_of"]

logger = logging.getLogger("dedupe")

# Short timeouts and few retries: a producer must not stall for long when the dedup Redis
# is down (redis-py's default retries a failing command ten times). Every script is
# idempotent per task id, so a retried command is safe.
_CLIENT_DEFAULTS: dict[str, Any] = {
    "socket_timeout": 2.0,
    "socket_connect_timeout": 1.0,
    "health_check_interval": 30,
}


def _default_retry() -> Retry:
    return Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.2), retries=2)


class Runtime:
    """What celery-dedupe keeps for one app. Built lazily: the app may be configured after
    :func:`install`, and a forked worker child builds its own connections."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        # One lock for the lazy parts: two threads of a threads-pool worker starting their
        # first tasks together must share one store and one heartbeat.
        self._lock = threading.Lock()
        self._config: DedupeConfig | None = None
        self._store: Store | None = None
        self._heartbeat: Heartbeat | None = None
        self._async_stores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncStore] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def config(self) -> DedupeConfig:
        if self._config is None:
            with self._lock:
                if self._config is None:
                    self._config = DedupeConfig.from_app(self.app)
        return self._config

    @property
    def store(self) -> Store:
        if self._store is None:
            config = self.config
            with self._lock:
                if self._store is None:
                    options = {
                        **_CLIENT_DEFAULTS,
                        "retry": _default_retry(),
                        **config.redis_options,
                    }
                    client = redis.Redis.from_url(config.redis_url, **options)
                    self._store = Store(client, busy_poll=config.busy_poll)
        return self._store

    def async_store(self) -> AsyncStore:
        """The asyncio store of the running event loop (a client serves one loop only)."""
        loop = asyncio.get_running_loop()
        store = self._async_stores.get(loop)
        if store is None:
            config = self.config
            store = AsyncStore.from_url(config.redis_url, _CLIENT_DEFAULTS, config.redis_options)
            self._async_stores[loop] = store
        return store

    @property
    def heartbeat(self) -> Heartbeat:
        if self._heartbeat is None:
            store = self.store
            with self._lock:
                if self._heartbeat is None:
                    self._heartbeat = Heartbeat(store)
        return self._heartbeat


# The runtime lives on the app itself (as Celery keeps its own per-app state): found with one
# attribute read on every call, and gone with the app.
_ATTRIBUTE = "_dedupe_runtime"
_install_lock = threading.Lock()


def install(app: Celery) -> None:
    """Enable celery-dedupe on ``app``: once, where the app is made, in producers and workers.

    It connects the worker's lifecycle handlers (claim, release, requeue) and nothing else:
    settings are read on first use, so configuring the app after this call is fine.

    >>> app = Celery("proj", broker="redis://localhost:6379/0")
    >>> install(app)
    """
    from . import worker  # the worker imports the runtime: import it at call time

    with _install_lock:
        if installed(app) is None:
            setattr(app, _ATTRIBUTE, Runtime(app))
    worker.connect_signals()


def installed(app: Any) -> Runtime | None:
    """The runtime of ``app``, or None when :func:`install` was not called for it."""
    runtime = getattr(app, _ATTRIBUTE, None)
    return runtime if isinstance(runtime, Runtime) else None


def runtime_of(app: Celery) -> Runtime:
    """The runtime of ``app``; raises :class:`NotInstalled` when there is none."""
    runtime = installed(app)
    if runtime is None:
        raise NotInstalled(str(app.main))
    return runtime
