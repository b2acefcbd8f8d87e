"""Prometheus metrics for the dedup layer (``pip install 'celery-dedupe[prometheus]'``).

One line where the app is made: ``dedupe.prometheus.enable(app)`` (a worker: ``port=9809``
serves ``/metrics``). More, with examples: the docs' API reference, dedupe.prometheus.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator

from celery import Celery, signals

from . import events
from .runs.inventory import live_key_counts
from .runs.runtime import runtime_of

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, start_http_server
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.multiprocess import MultiProcessCollector
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "dedupe.prometheus needs prometheus_client: pip install 'celery-dedupe[prometheus]'"
    ) from exc

__all__ = ["LiveKeys", "enable"]

# The worker's family: what it says at start goes where Celery's own start lines go.
logger = logging.getLogger("dedupe.worker")

_lock = threading.Lock()
#: The registry that is exported, once set up (the counter lives in the default one).
_exported: CollectorRegistry | None = None
_apps: weakref.WeakSet[Celery] = weakref.WeakSet()


def _set_up() -> CollectorRegistry:
    """The counter, its signal receivers and the live-keys collector: once per process."""
    global _exported
    with _lock:
        if _exported is None:
            counter = Counter(
                "dedupe_events",
                "Events of dedup keys (calls accepted and deduplicated, runs claimed, ...)",
                ["event", "task"],
            )
            for name, event in events.EVENTS.items():
                event.signal.connect(_counting(counter, name), weak=False)
            _exported = _exported_registry()
            _exported.register(LiveKeys())
            # (After the worker set up its logging, before its pool starts.)
            signals.celeryd_after_setup.connect(_check_pool, weak=False)
        return _exported


def _counting(counter: Counter, name: str) -> Callable[..., None]:
    def count(task_name: str = "", **_: object) -> None:
        counter.labels(event=name, task=task_name).inc()

    return count


class LiveKeys:
    """The collector of ``dedupe_live_keys{task, state}``: every enabled app's keys, read
    from Redis at each scrape (apps that share a Redis and a prefix are read once)."""

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "dedupe_live_keys",
            "Dedup keys live in Redis, by task and state",
            labels=["task", "state"],
        )
        totals: collections.Counter[tuple[str, str]] = collections.Counter()
        seen: set[tuple[str, str]] = set()
        for app in list(_apps):
            runtime = runtime_of(app)
            where = (str(runtime.config.redis_url), runtime.config.key_prefix)
            if where not in seen:
                seen.add(where)
                totals.update(live_key_counts(app))
        for (task, state), count in sorted(totals.items()):
            gauge.add_metric([task, state], count)
        yield gauge

    def describe(self) -> Iterable[Metric]:
        # Describing without collecting: registering must not scan Redis.
        return [GaugeMetricFamily("dedupe_live_keys", "", labels=["task", "state"])]


def enable(app: Celery, *, port: int | None = None) -> CollectorRegistry:
    """Count every event of the dedup layer and export ``app``'s live keys; with ``port``,
    serve ``/metrics`` from the worker's main process (started at ``worker_init``). Returns
    the registry that is exported (the default one, or the multiprocess one).

    ```python
    app = Celery("proj")
    dedupe.install(app)
    dedupe.prometheus.enable(app, port=9809)
    ```
    """
    registry = _set_up()
    _apps.add(app)
    if port is not None:
        _serve_from_worker(app, port, registry)
    return registry


def _exported_registry() -> CollectorRegistry:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # The counters live in files, one set per process: the exported registry sums them.
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return REGISTRY


def _check_pool(sender: object = None, instance: object = None, **_: object) -> None:
    """At the start of a worker of an enabled app: say so if its children's counts are lost
    (a prefork pool runs tasks in child processes, whose counters only prometheus_client's
    multiprocess mode brings to the process that exports them)."""
    app = getattr(instance, "app", None)
    if app is None or app not in _apps or os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    if not _forks_children(getattr(instance, "pool_cls", None)):
        return
    logger.warning(
        "dedupe.prometheus is enabled on Celery app %r, but this worker's prefork pool runs "
        "tasks in child processes and PROMETHEUS_MULTIPROC_DIR is not set: the run events "
        "(run_claimed, key_released, ...) are counted in the children and never exported. "
        "Set PROMETHEUS_MULTIPROC_DIR to an empty directory the worker may write to, in its "
        "environment before it starts, or run it with -P threads or -P solo",
        app.main,
    )


def _forks_children(pool: object) -> bool:
    """Is ``pool`` (a worker's pool class, or its name) Celery's prefork pool?"""
    if isinstance(pool, str):
        return pool in _PREFORK_NAMES
    # (A subclass of the prefork pool was imported with it: not imported here, where a gevent
    # or eventlet worker has no use for billiard.)
    prefork = sys.modules.get("celery.concurrency.prefork")
    return prefork is not None and isinstance(pool, type) and issubclass(pool, prefork.TaskPool)


#: What a worker's ``pool_cls`` may say for the prefork pool before it is resolved to the
#: class (Celery's aliases, and the class's path).
_PREFORK_NAMES = frozenset({"prefork", "processes", "celery.concurrency.prefork:TaskPool"})


def _serve_from_worker(app: Celery, port: int, registry: CollectorRegistry) -> None:
    def serve(sender: object = None, **_: object) -> None:
        if getattr(sender, "app", None) is app:
            start_http_server(port, registry=registry)

    signals.worker_init.connect(serve, weak=False)
