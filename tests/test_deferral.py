"""A run that meets its key held is tried again later: each deferral of its message waits
twice as long as the one before, up to a cap, and the message gives up after a bounded
number of them, its result naming the holder. Each deferral is logged with the holder.

In-process workers; the holder is a call queued for later, which holds its key throughout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery, signals
from celery.exceptions import TaskRevokedError

import dedupe
from dedupe import events
from dedupe.worker.deferral import DEFERRALS, SINCE

from .conftest import in_process_worker
from .helpers import Lines, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def deferred() -> Iterator[list[dict[str, Any]]]:
    """The run_deferred sends of this test."""
    sends: list[dict[str, Any]] = []

    def receiver(sender: Any = None, **kwargs: Any) -> None:
        sends.append(kwargs)

    events.run_deferred.connect(receiver, weak=False)
    yield sends
    events.run_deferred.disconnect(receiver)


def refresh_task(app: Celery) -> Any:
    @app.task(
        shared=False,
        base=dedupe.DedupeTask,
        unique=True,
        on_running="retry",
        on_running_countdown=0.1,
    )
    def refresh(x: int) -> None: ...

    return refresh


def test_each_deferral_of_a_message_waits_twice_as_long_as_the_one_before_up_to_the_cap(
    make_app: Callable[..., Celery], deferred: list[dict[str, Any]]
) -> None:
    app = make_app(dedupe_deferral_cap=0.4)
    refresh = refresh_task(app)
    refresh.apply_async((1,), countdown=60)  # holds the key, queued, throughout
    with in_process_worker(app, queues=["bypass"]):
        app.send_task(refresh.name, args=(1,), queue="bypass")
        wait_for(lambda: len(deferred) >= 5, message="five deferrals")
    assert [send["countdown"] for send in deferred[:5]] == [0.1, 0.2, 0.4, 0.4, 0.4]
    assert [send["deferral"] for send in deferred[:5]] == [1, 2, 3, 4, 5]


def test_a_message_gives_up_after_the_last_deferral_and_its_result_names_the_holder(
    make_app: Callable[..., Celery], deferred: list[dict[str, Any]]
) -> None:
    app = make_app(dedupe_max_deferrals=3, dedupe_deferral_cap=0.2)
    refresh = refresh_task(app)
    holder = refresh.apply_async((1,), countdown=60)
    with in_process_worker(app, queues=["bypass"]):
        bypass = app.send_task(refresh.name, args=(1,), queue="bypass")
        with pytest.raises(TaskRevokedError, match=f"{holder.id}.* is queued.*gave up after 3"):
            bypass.get(timeout=10)
    assert len(deferred) == 3


def test_a_deferred_message_carries_when_it_was_first_deferred(
    make_app: Callable[..., Celery],
) -> None:
    # A call accepted after that moment came while this message waited (a restart lost its
    # record): wait.lua lets the message hold its key ahead of that call.
    app = make_app(dedupe_max_deferrals=3, dedupe_deferral_cap=0.2)
    refresh = refresh_task(app)
    refresh.apply_async((1,), countdown=60)
    sent: list[Any] = []

    def on_publish(headers: Any = None, **_: Any) -> None:
        if headers and headers.get(DEFERRALS):
            sent.append(headers.get(SINCE))

    signals.before_task_publish.connect(on_publish, weak=False)
    try:
        start = time.time()
        with in_process_worker(app, queues=["bypass"]):
            bypass = app.send_task(refresh.name, args=(1,), queue="bypass")
            with pytest.raises(TaskRevokedError):
                bypass.get(timeout=10)
    finally:
        signals.before_task_publish.disconnect(on_publish)
    assert len(sent) == 3
    assert len(set(sent)) == 1
    assert start <= sent[0] <= time.time()


def test_each_deferral_is_logged_naming_the_holder(make_app: Callable[..., Celery]) -> None:
    app = make_app(dedupe_max_deferrals=2, dedupe_deferral_cap=0.2)
    refresh = refresh_task(app)
    holder = refresh.apply_async((1,), countdown=60)
    with Lines("dedupe.runs", logging.INFO) as log, in_process_worker(app, queues=["bypass"]):
        bypass = app.send_task(refresh.name, args=(1,), queue="bypass")
        with pytest.raises(TaskRevokedError):
            bypass.get(timeout=10)
    waits = [line for line in log.lines if "waits:" in line]
    head = f"{refresh.name}[{bypass.id}] waits: {holder.id} is queued"
    assert waits == [
        f"{head} (deferral 1, tries again in 0.1s)",
        f"{head} (deferral 2, tries again in 0.2s)",
    ]


def test_a_call_that_gives_up_waiting_frees_its_key(make_app: Callable[..., Celery]) -> None:
    # unique_until="started": a call made during a run is accepted and queued; if it gives up
    # waiting for the run, its queued record must not answer later calls for its whole ttl.
    app = make_app(dedupe_max_deferrals=2, dedupe_deferral_cap=0.2)

    @app.task(
        shared=False,
        base=dedupe.DedupeTask,
        unique=True,
        unique_until="started",
        on_running_countdown=0.1,
    )
    def report(day: str, seconds: float) -> None:
        time.sleep(seconds)

    with in_process_worker(app, pool="threads", concurrency=2):
        first = report.delay("mon", 4)
        wait_for(lambda: (h := dedupe.lookup(report, ("mon", 4))) and h.state == "running")
        waiting = report.delay("mon", 4)
        assert waiting.deduplicated is False
        with pytest.raises(TaskRevokedError, match="gave up after 2"):
            waiting.get(timeout=10)
        assert report.delay("mon", 4).deduplicated is False  # the call that gave up holds nothing
        first.get(timeout=10)


def test_a_call_whose_deferral_cannot_be_sent_frees_its_key(
    make_app: Callable[..., Celery],
) -> None:
    # Acked at its delivery, a message whose deferral's publish fails is gone (Celery raises,
    # as for a retry it cannot send): the call's queued record must go with it, not answer
    # later calls with a task id that never runs.
    app = make_app(dedupe_deferral_cap=0.2)

    # The calls publish json; the deferral, sent by the worker, takes the task's serializer,
    # which nobody registered: its publish fails before anything is sent.
    @app.task(
        shared=False,
        base=dedupe.DedupeTask,
        unique=True,
        unique_until="started",
        on_running_countdown=0.1,
        serializer="dedupe-test-unregistered",
    )
    def report(day: str, seconds: float) -> None:
        time.sleep(seconds)

    with in_process_worker(app, pool="threads", concurrency=2):
        first = report.apply_async(("mon", 4), serializer="json")
        wait_for(lambda: (h := dedupe.lookup(report, ("mon", 4))) and h.state == "running")
        waiting = report.apply_async(("mon", 4), serializer="json")
        assert waiting.deduplicated is False
        with pytest.raises(Exception, match="dedupe-test-unregistered"):
            waiting.get(timeout=10)
        assert first.state == "STARTED" or not first.ready()  # (the holder still runs)
        assert report.apply_async(("mon", 4), serializer="json").deduplicated is False
        first.get(timeout=10)
