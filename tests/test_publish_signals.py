"""Celery's publish signals and task-sent events see a deduplicated call as a plain one:
``before_task_publish`` and ``after_task_publish`` fire as a pair or not at all for each call
(a duplicate refused at the push had its first already), and a task-sent event means a
published message. Real brokers; no worker: the first call's message stays queued, so the
calls after it are duplicates (one-step or pipelined first, decided first once the task is
known for its duplicates)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery, signals

import dedupe

from .helpers import wait_for

#: One accepted call and its duplicates: past the first few, the task decides first.
DUPLICATES = 12


def _job(app: Celery) -> Any:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def refresh(customer_id: int) -> None: ...

    return refresh


@pytest.mark.parametrize(
    "call",
    [lambda job: job.delay(7), lambda job: job.delay_unique(7)],
    ids=["delay", "delay_unique"],
)
def test_every_call_fires_before_and_after_task_publish_as_a_pair_or_neither(
    app: Celery, published: dict[str, Counter[str]], call: Callable[[Any], Any]
) -> None:
    job = _job(app)
    results = [call(job) for _ in range(1 + DUPLICATES)]
    assert [result.deduplicated for result in results] == [False] + [True] * DUPLICATES
    assert published["before"] == published["after"]
    assert published["after"][results[0].id] == 1


def test_a_duplicate_refused_at_the_push_sends_after_task_publish_as_celery_sent_before(
    app: Celery, published: dict[str, Counter[str]]
) -> None:
    job = _job(app)
    job.delay(7)
    kwargs: dict[str, dict[str, Any]] = {}

    def keep(name: str) -> Callable[..., None]:
        def receiver(signal: Any = None, **given: Any) -> None:
            kwargs[name] = given

        return receiver

    before, after = keep("before"), keep("after")
    signals.before_task_publish.connect(before, weak=False)
    signals.after_task_publish.connect(after, weak=False)
    try:
        job.delay(7)  # (the task's first duplicate: refused at the push, if anywhere)
    finally:
        signals.before_task_publish.disconnect(before)
        signals.after_task_publish.disconnect(after)
    assert kwargs, "this duplicate was decided before Celery's publish"
    assert kwargs["after"] == {
        name: kwargs["before"][name]
        for name in ("sender", "body", "exchange", "routing_key", "headers")
    }


def _task_sent_ids(app: Celery, calls: Callable[[], int]) -> list[str]:
    """The task ids of the task-sent events sent while ``calls`` runs (it returns how many
    it expects)."""
    sent: list[str] = []
    ready = threading.Event()
    with app.connection_for_read() as connection:
        receiver = app.events.Receiver(
            connection, handlers={"task-sent": lambda event: sent.append(event["uuid"])}
        )
        # A fanout reaches the queues bound when it is sent: the calls wait for the consumer.
        receiver.on_consume_ready = lambda *_, **__: ready.set()
        capturing = threading.Thread(target=receiver.capture, kwargs={"wakeup": False})
        capturing.start()
        try:
            assert ready.wait(10), "the event receiver never consumed"
            expected = calls()
            wait_for(lambda: len(sent) >= expected, message="the task-sent events")
            time.sleep(0.5)  # (one more would come by now)
        finally:
            receiver.should_stop = True
            capturing.join(10)
    return sent


def test_task_sent_events_are_sent_for_published_messages_only(make_app: Any, broker: str) -> None:
    app = make_app(broker=broker, task_send_sent_event=True)
    job = _job(app)
    results: list[Any] = []

    def calls() -> int:
        results.extend(job.delay(index % 3) for index in range(3 + DUPLICATES))
        return 3

    sent = _task_sent_ids(app, calls)
    accepted = [result.id for result in results if not result.deduplicated]
    assert len(accepted) == 3
    assert sorted(sent) == sorted(accepted)
