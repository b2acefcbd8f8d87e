"""A delivery this layer ends by sending its message again (a deferral, a debounced message
before its deadline, a limited run's wait) leaves nothing for the garbage collector: Celery's
tracer holds the Retry in a reference cycle through its own frame (Celery issue 8882), which
only a full collection frees, and a pool process's memory climbed to a plateau 75 MiB above
its start under a steady stream of them (the hour soak, docs/cost.md)."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import pytest
from celery import Celery, signals

import dedupe

from .conftest import in_process_worker
from .helpers import wait_for


@pytest.fixture
def no_collector() -> Iterator[None]:
    """The cyclic garbage collector off: only what reference counting frees is freed."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def retried() -> Iterator[list[weakref.ref[object]]]:
    """A weak reference to the ExceptionInfo of each retry Celery reports: what the cycle
    held (a copy of every frame's code positions, about 300 KB). (A Retry itself stays in
    a small cycle of its own making: its ``args`` hold it.)"""
    found: list[weakref.ref[object]] = []

    def heard(einfo: object = None, **_: object) -> None:
        if einfo is not None:
            found.append(weakref.ref(einfo))

    signals.task_retry.connect(heard, weak=False)
    yield found
    signals.task_retry.disconnect(heard)


@pytest.mark.usefixtures("no_collector")
def test_a_deferred_delivery_leaves_no_cycle_for_the_collector(
    app: Celery, retried: list[weakref.ref[object]]
) -> None:
    gate = threading.Event()

    @app.task(
        shared=False,
        base=dedupe.DedupeTask,
        exclusive=True,
        on_running="retry",
        on_running_countdown=0.2,
    )
    def nightly(x: int) -> None:
        gate.wait(10)

    with in_process_worker(app, pool="threads", concurrency=2):
        first = nightly.delay(1)
        second = nightly.delay(1)  # (queued too, and deferred while the first runs)
        wait_for(lambda: retried, message="the second delivery deferred")
        # As its trace ends, Celery's frame goes, and with it what it held; never, in a cycle.
        wait_for(
            lambda: retried[0]() is None,
            message="the deferral's ExceptionInfo to go with its delivery (reference counting)",
        )
        gate.set()
        first.get(timeout=10)
        second.get(timeout=10)
