"""What celery-dedupe keeps for one app: settings, Redis stores and the heartbeat.

Built lazily on first use: the app may be configured after ``dedupe.install(app)``, and a
forked worker child builds its own connections.
"""

from __future__ import annotations

import asyncio
import threading
import weakref

from celery import Celery
from redis.backoff import FullJitterBackoff, NoBackoff
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from dedupe.brokers.broker import Broker
from dedupe.brokers.choice import broker_of
from dedupe.compat import kombu_private
from dedupe.errors import NotInstalled, RedisUnavailable
from dedupe.recovery.unacked import RestartWatch
from dedupe.store.async_store import AsyncStore
from dedupe.store.clients import DedupRedis, sync_client
from dedupe.store.store import Store
from dedupe.values import defaults
from dedupe.values.config import DedupeConfig
from dedupe.values.urls import cluster_target

from .heartbeat import Heartbeat

__all__ = ["Runtime", "add_runtime", "installed", "runtime_of"]


class Runtime:
    """What celery-dedupe keeps for one app."""

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
        self._broker: Broker | None = None
        self._broker_is_store: bool | None = None
        #: Per task name: the share of its recent calls that were duplicates.
        self.duplicate_share: dict[str, float] = {}

    @property
    def broker(self) -> Broker:
        """The app's kind of broker, decided at first use (the app may be configured after
        ``dedupe.install``)."""
        if self._broker is None:
            self._broker = broker_of(self.app)
        return self._broker

    @property
    def broker_is_store(self) -> bool:
        """Is the broker the dedup store's own server and database? Then a call's record and
        message can be written in one step."""
        if self._broker_is_store is None:
            # (A Cluster's client connects as it is made, and kombu has no Cluster transport.)
            cluster = cluster_target(self.config.redis_url) is not None
            self._broker_is_store = not cluster and self.broker.is_store(self.store)
        return self._broker_is_store

    @property
    def one_step(self) -> bool:
        """Can a call's record and message be written in one step (the broker is the store,
        and kombu's members the one-step publish needs are there)?"""
        return kombu_private.ONE_STEP and self.broker_is_store

    def count_call(self, task_name: str, duplicate: bool) -> None:
        """Fold one call's verdict into the task's duplicate share."""
        share = self.duplicate_share.get(task_name, 0.0)
        weight = defaults.RATE_WEIGHT
        self.duplicate_share[task_name] = share + weight * (float(duplicate) - share)

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
                    # (Jittered exponential; every redis-py from 5.0 on has this class.)
                    backoff = FullJitterBackoff(
                        base=defaults.RETRY_BACKOFF_BASE, cap=defaults.RETRY_BACKOFF_CAP
                    )
                    options = {
                        **defaults.CLIENT_OPTIONS,
                        "retry": Retry(backoff, retries=defaults.RETRIES),
                        **config.redis_options,
                    }
                    try:
                        client = sync_client(config.redis_url, options, config.call_budget)
                    except RedisClusterException as exc:
                        # A Cluster's client learns the layout as it is made: no node
                        # answered. Made again at the next call.
                        raise RedisUnavailable("connect", exc) from exc
                    store = Store(
                        client,
                        busy_poll=config.busy_poll_in_pool if _in_pool else config.busy_poll,
                        budget=config.call_budget,
                        remember_duplicates=config.remember_duplicates,
                    )
                    # Set before any call can use the store.
                    store.barrier = self._restart_watch(store)
                    self._store = store
        return self._store

    def watch_client(self, socket_timeout: float) -> DedupRedis:
        """A client of the dedup store for a connection that blocks (:mod:`dedupe.recovery.held`):
        no retries (a lost connection is news to its caller), reads that wait up to
        ``socket_timeout`` seconds."""
        config = self.config
        options = {
            **defaults.CLIENT_OPTIONS,
            **config.redis_options,
            "socket_timeout": socket_timeout,
            "retry": Retry(NoBackoff(), retries=0),
            "health_check_interval": 0,
        }
        return sync_client(config.redis_url, options, config.call_budget)

    @property
    def existing_store(self) -> Store | None:
        """The store if it was made already (never makes one)."""
        return self._store

    def async_store(self) -> AsyncStore:
        """The asyncio store of the running event loop (a client serves one loop only)."""
        loop = asyncio.get_running_loop()
        store = self._async_stores.get(loop)
        if store is None:
            config = self.config
            store = AsyncStore.from_url(
                config.redis_url, config.redis_options, budget=config.call_budget
            )
            if cluster_target(config.redis_url) is None:
                # (A Cluster has no barrier, and its sync client connects as it is made.)
                store.barrier = self.store.barrier
            self._async_stores[loop] = store
        return store

    @property
    def heartbeat(self) -> Heartbeat:
        if self._heartbeat is None:
            store = self.store
            watch = store.barrier if isinstance(store.barrier, RestartWatch) else None
            every = self.config.default_lease / 3
            with self._lock:
                if self._heartbeat is None:
                    self._heartbeat = Heartbeat(store, watch, every)
        return self._heartbeat

    def _restart_watch(self, store: Store) -> RestartWatch | None:
        config = self.config
        return self.broker.restart_watch(store, config.key_prefix, config.default_lease)


# The runtime lives on the app itself (as Celery keeps its own per-app state): found with one
# attribute read on every call, and gone with the app.
_ATTRIBUTE = "_dedupe_runtime"
_lock = threading.Lock()
#: Every runtime of this process, for :func:`pool_process_started`.
_runtimes: weakref.WeakSet[Runtime] = weakref.WeakSet()
#: This process is one of a prefork pool's.
_in_pool = False


def pool_process_started() -> None:
    """This process is a prefork pool's (``worker_process_init``): each store polls for
    replies as ``dedupe_busy_poll_us`` says for one, by default not at all."""
    global _in_pool
    _in_pool = True
    for runtime in list(_runtimes):
        store = runtime.existing_store
        if store is not None:  # (made by the pool's parent before it forked)
            store.poll_for(runtime.config.busy_poll_in_pool)


def add_runtime(app: Celery) -> Runtime:
    """The runtime of ``app``, made now if it has none (``dedupe.install`` calls this)."""
    with _lock:
        runtime = installed(app)
        if runtime is None:
            runtime = Runtime(app)
            setattr(app, _ATTRIBUTE, runtime)
            _runtimes.add(runtime)
        return runtime


def installed(app: object) -> Runtime | None:
    """The runtime of ``app``, or None when ``dedupe.install`` was not called for it."""
    runtime = getattr(app, _ATTRIBUTE, None)
    return runtime if isinstance(runtime, Runtime) else None


def runtime_of(app: Celery) -> Runtime:
    """The runtime of ``app``; raises :class:`NotInstalled` when there is none."""
    runtime = installed(app)
    if runtime is None:
        raise NotInstalled(str(app.main))
    return runtime
