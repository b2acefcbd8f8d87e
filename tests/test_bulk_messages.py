"""A batch's accepted calls go out as Celery sends each call alone: on a Redis broker that is
the dedup store, the messages ``apply_many`` pushes, the arguments its ``before_task_publish``
and ``after_task_publish`` receivers get and its ``task-sent`` events equal those of plain
``apply_async`` for the same calls (ids, the clock and the dedup header aside).

The batch's sender (dedupe.producer.call_sender) builds them without Celery's apply_async for
the options it takes; the others ("left to Celery") show that it hands those to apply_async.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import pickle
import time
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import redis
from celery import Celery, Task, signals

import dedupe
from dedupe.producer.call_sender import CallSender
from dedupe.producer.guard import Call
from dedupe.values.header import HEADER

# What differs between two sends of one call: its ids, and what is read from the clock.
_PER_MESSAGE = {"id", "root_id", "task_id", "correlation_id", "delivery_tag", "uuid"}
_CLOCK = frozenset({"eta", "expires", "timestamp", "clock", "local_received"})


def _normalised(value: Any, clock: frozenset[str] = _CLOCK) -> Any:
    if isinstance(value, dict):
        return {
            key: ("<clock>" if key in clock and item is not None else _normalised(item, clock))
            for key, item in value.items()
            if key not in _PER_MESSAGE and key != HEADER
        }
    if isinstance(value, (list, tuple)):
        return [_normalised(item, clock) for item in value]
    return value


def _body(message: dict[str, Any]) -> Any:
    body = base64.b64decode(message["body"])
    if message["headers"].get("compression") == "application/x-gzip":
        body = zlib.decompress(body)
    if message["content-type"] == "application/x-python-serialize":
        return pickle.loads(body)
    return json.loads(body)


def _message(raw: bytes, clock: frozenset[str]) -> Any:
    message = json.loads(raw)
    message["body"] = _body(message)
    return _normalised(message, clock)


def _in_five_minutes() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=300)


class Case(NamedTuple):
    #: The batch's options (made at the call: some read the clock).
    options: Callable[[], dict[str, Any]]
    #: Does the batch's sender take them? (Else Celery's apply_async does.)
    by_the_sender: bool = True
    #: Fields read from the clock.
    clock: frozenset[str] = _CLOCK


#: The queue of the "routed queue" case: this process's own (RabbitMQ is shared by every run
#: on the machine, and a message another run routed there would be taken for this one's).
ROUTED = f"routed-{os.getpid()}"
CASES: dict[str, Case] = {
    "default queue": Case(dict),
    "routed queue": Case(lambda: {"queue": ROUTED}),
    "priority": Case(lambda: {"priority": 7}),
    "eta": Case(lambda: {"eta": _in_five_minutes()}),
    "countdown": Case(lambda: {"countdown": 300}),
    "expires": Case(lambda: {"expires": 600}),
    "time limits": Case(lambda: {"time_limit": 60, "soft_time_limit": 30}),
    "ignore_result": Case(lambda: {"ignore_result": True}),
    "zlib": Case(lambda: {"compression": "zlib"}),
    "pickle": Case(lambda: {"serializer": "pickle"}),
    "headers": Case(lambda: {"headers": {"tenant": "acme"}}),
    "shadow (left to Celery)": Case(lambda: {"shadow": "renamed"}, by_the_sender=False),
    "reply_to (left to Celery)": Case(lambda: {"reply_to": "elsewhere"}, by_the_sender=False),
    "origin (left to Celery)": Case(lambda: {"origin": "gen1@elsewhere"}, by_the_sender=False),
    # (The message's expiration is then read from the clock too.)
    "expires at a time (left to Celery)": Case(
        lambda: {"expires": dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=600)},
        by_the_sender=False,
        clock=_CLOCK | {"expiration"},
    ),
}


@pytest.fixture
def one_step_app(make_app: Callable[..., Celery]) -> Celery:
    app = make_app(task_send_sent_event=True)  # a Redis broker on the dedup store's server
    assert dedupe.runs.runtime.installed(app).broker_is_store  # type: ignore[union-attr]
    return app


@pytest.fixture
def tasks(one_step_app: Celery) -> dict[str, Any]:
    app = one_step_app

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def unique_job(x: int) -> int:
        return x

    @app.task(shared=False)
    def plain_job(x: int) -> int:
        return x

    # Execution options of the task's own: apply_async merges them under the call's.
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, priority=3, time_limit=90)
    def configured_job(x: int) -> int:
        return x

    return {"unique": unique_job, "plain": plain_job, "configured": configured_job}


class Sent:
    """What a block of sends pushed, told the publish signals' receivers and sent as events,
    with the fields that differ between two sends of a call normalised away."""

    def __init__(self, client: redis.Redis, app: Celery, clock: frozenset[str]) -> None:
        self.client = client
        self.app = app
        self.clock = clock
        self.signals: list[Any] = []
        self.events: list[Any] = []
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)

    def lists(self) -> dict[bytes, list[Any]]:
        default = self.app.conf.task_default_queue
        names = sorted([*self.client.keys(f"{default}*"), *self.client.keys("routed*")])
        return {
            name: [_message(raw, self.clock) for raw in self.client.lrange(name, 0, -1)]
            for name in names
        }

    def read_events(self, count: int) -> None:
        deadline = time.monotonic() + 5
        while len(self.events) < count:
            assert time.monotonic() < deadline, "a task-sent event did not come"
            # (None also for the subscription's confirmation, which the pubsub drops)
            message = self._pubsub.get_message(timeout=0.5)
            if message is not None:
                event = json.loads(base64.b64decode(json.loads(message["data"])["body"]))
                # (Not another test's worker, still up, beating on the same server.)
                if event.get("type") == "task-sent":
                    self.events.append(_normalised(event, self.clock))

    def taken(self, count: int) -> tuple[Any, ...]:
        """What the sends of ``count`` calls made, taken away."""
        self.read_events(count)
        made = (self.lists(), list(self.signals), list(self.events))
        self.clear()
        return made

    def key_headers(self) -> list[str]:
        """The dedup headers of the messages pushed, in no particular order."""
        default = self.app.conf.task_default_queue
        names = [*self.client.keys(f"{default}*"), *self.client.keys("routed*")]
        raw = [m for name in names for m in self.client.lrange(name, 0, -1)]
        return [json.loads(m)["headers"].get(HEADER) for m in raw]

    def clear(self) -> None:
        for name in self.lists():
            self.client.delete(name)
        self.signals.clear()
        self.events.clear()

    def _before(self, sender: Any = None, **kwargs: Any) -> None:
        kwargs.pop("signal", None)
        kwargs["declare"] = [repr(entity) for entity in kwargs.get("declare") or ()]
        self.signals.append(("before", sender, _normalised(kwargs, self.clock)))

    def _after(self, sender: Any = None, **kwargs: Any) -> None:
        kwargs.pop("signal", None)
        self.signals.append(("after", sender, _normalised(kwargs, self.clock)))

    def __enter__(self) -> Sent:
        self.clear()  # (another test's routed lists)
        self._pubsub.psubscribe("*celeryev*")
        signals.before_task_publish.connect(self._before, weak=False)
        signals.after_task_publish.connect(self._after, weak=False)
        return self

    def __exit__(self, *exc_info: object) -> None:
        signals.before_task_publish.disconnect(self._before)
        signals.after_task_publish.disconnect(self._after)
        self._pubsub.close()
        self.clear()


@pytest.mark.parametrize("task_kind", ["unique", "plain", "configured"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_batch_sends_what_celery_sends_for_each_call(
    one_step_app: Celery,
    redis_client: redis.Redis,
    tasks: dict[str, Any],
    task_kind: str,
    case: str,
) -> None:
    task = tasks[task_kind]
    options_of, by_the_sender, clock = CASES[case]
    calls = [((n,), {}) for n in (1, 2, 3)]
    with Sent(redis_client, one_step_app, clock) as sent:
        extra = {"unique": False} if task_kind != "plain" else {}
        alone = [task.apply_async(args, **extra, **options_of()) for args, _ in calls]
        by_celery = sent.taken(len(calls))

        batch = dedupe.apply_many(task, calls, **options_of())
        key_headers = sent.key_headers()
        by_the_batch = sent.taken(len(calls))

    assert [r.deduplicated for r in batch] == [False, False, False]
    assert {r.id for r in batch}.isdisjoint(r.id for r in alone)
    # Each message carries its own call's keys (the comparison leaves the header out).
    assert sorted(header.rpartition("|")[2] for header in key_headers) == sorted(
        r.keys.call for r in batch if r.keys is not None
    )
    lists, signals_sent, events_sent = by_the_batch
    assert list(lists) == list(by_celery[0])  # the same lists (route, priority)
    assert lists == by_celery[0]
    assert signals_sent == by_celery[1]
    assert events_sent == by_celery[2]
    # The batch went the way the case says (so that the comparison covers the sender).
    with one_step_app.producer_pool.acquire(block=True) as producer:
        sender = CallSender.of(Call.of(task, (1,), {}, options_of()), producer)
    assert sender is not None
    assert sender.takes(options_of()) is by_the_sender


def test_a_batch_made_in_a_run_sends_what_celery_sends_for_each_call(
    make_app: Callable[..., Celery], redis_client: redis.Redis
) -> None:
    # The run's ids become the calls' parent and root, and its priority theirs.
    app = make_app(task_inherit_parent_priority=True)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> int:
        return x

    calls = [((n,), {}) for n in (1, 2, 3)]
    made: dict[str, Any] = {}

    @app.task(shared=False)
    def outer() -> None:
        with Sent(redis_client, app, _CLOCK) as sent:
            for args, _ in calls:
                job.apply_async(args, unique=False)
            made["by celery"] = sent.taken(0)
            made["batch"] = dedupe.apply_many(job, calls)
            made["by the batch"] = sent.taken(0)

    run = outer.apply(priority=4)
    assert run.successful(), run.traceback
    assert [r.deduplicated for r in made["batch"]] == [False, False, False]
    lists = made["by the batch"][0]
    assert lists == made["by celery"][0]
    assert made["by the batch"][1] == made["by celery"][1]
    (messages,) = lists.values()
    assert {m["headers"]["parent_id"] for m in messages} == {run.id}
    assert {m["properties"]["priority"] for m in messages} == {4}


def test_a_batch_routed_by_its_arguments_is_routed_call_by_call(
    make_app: Callable[..., Celery], redis_client: redis.Redis
) -> None:
    def by_parity(name: str, args: Any, kwargs: Any, options: Any, **_: Any) -> Any:
        return {"queue": "routed-odd" if args[0] % 2 else "routed-even"}

    app = make_app(task_routes=(by_parity,))

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> int:
        return x

    redis_client.delete("routed-odd", "routed-even")
    try:
        results = dedupe.apply_many(job, [((n,), {}) for n in (1, 2, 3)])
        odd, even = (redis_client.lrange(q, 0, -1) for q in ("routed-odd", "routed-even"))
    finally:
        redis_client.delete("routed-odd", "routed-even")
    assert [r.deduplicated for r in results] == [False, False, False]
    assert sorted(json.loads(m)["headers"]["id"] for m in odd) == sorted(
        [results[0].id, results[2].id]
    )
    assert [json.loads(m)["headers"]["id"] for m in even] == [results[1].id]


class Stamping(Task):  # type: ignore[misc]
    """A base whose apply_async adds a header: a batch of its tasks must go through it."""

    def apply_async(self, *args: Any, **options: Any) -> Any:
        options["headers"] = {**(options.get("headers") or {}), "stamped": "yes"}
        return super().apply_async(*args, **options)


@pytest.mark.parametrize("unique_base", [True, False], ids=["DedupeTask first", "plain"])
def test_a_batch_of_a_task_whose_base_overrides_apply_async_goes_through_it(
    one_step_app: Celery, redis_client: redis.Redis, unique_base: bool
) -> None:
    class UniqueStamping(dedupe.DedupeTask, Stamping):  # type: ignore[misc]
        unique = True

    base = UniqueStamping if unique_base else Stamping

    @one_step_app.task(shared=False, base=base)
    def job(x: int) -> int:
        return x

    with Sent(redis_client, one_step_app, _CLOCK) as sent:
        results = dedupe.apply_many(job, [((1,), {}), ((2,), {})])
        (messages,) = sent.taken(0)[0].values()
    assert [r.deduplicated for r in results] == [False, False]
    assert [m["headers"].get("stamped") for m in messages] == ["yes", "yes"]
