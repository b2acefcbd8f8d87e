"""A single accepted call goes out as Celery sends it: the message a deduplicated call
publishes, and the arguments its ``before_task_publish`` and ``after_task_publish`` receivers
get, equal those of plain ``apply_async`` for the same call (ids, the clock and the dedup
header aside), on a Redis broker (with its ``task-sent`` events) and on RabbitMQ.

A single call is sent by a sender made once per task and thread (dedupe.producer.call_sender
``sender_for``), without Celery's apply_async for the options it takes; the cases marked
"left to Celery" and, on RabbitMQ, a countdown or an eta show that it hands the others to
apply_async.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Queue

import dedupe
from dedupe.producer.call_sender import sender_for
from dedupe.producer.guard import Call

from .test_bulk_messages import _CLOCK, CASES, ROUTED, Sent, _body, _normalised

#: Cases a sender leaves to Celery on RabbitMQ too: send_task routes a delayed call there.
_DELAYED = {"eta", "countdown"}


class AmqpSent(Sent):
    """:class:`Sent` for RabbitMQ: the messages are taken off the queues they were routed to
    (the task-sent events go to an exchange nobody reads here: not compared)."""

    QUEUES = (ROUTED,)

    def lists(self) -> dict[bytes, list[Any]]:
        made: dict[bytes, list[Any]] = {}
        with self.app.connection_for_write() as connection:
            channel = connection.default_channel
            for name in (self.app.conf.task_default_queue, *self.QUEUES):
                messages = []
                while (message := _basic_get(channel, name)) is not None:
                    messages.append(_amqp_message(message, self.clock))
                if messages:
                    made[name.encode()] = messages
        return made

    def read_events(self, count: int) -> None:
        pass

    def __enter__(self) -> AmqpSent:
        super().__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        super().__exit__(*exc_info)
        with self.app.connection_for_write() as connection:
            for name in self.QUEUES:
                connection.default_channel.queue_delete(name)


def _basic_get(channel: Any, queue: str) -> Any:
    try:
        return channel.basic_get(queue, no_ack=True)
    except Exception as exc:  # (a queue never declared: nothing was routed there)
        if "NOT_FOUND" in str(exc):
            return None
        raise


def _amqp_message(message: Any, clock: frozenset[str]) -> Any:
    raw = {
        "body": message.body,
        "headers": dict(message.headers),
        "properties": {k: v for k, v in message.properties.items() if k != "application_headers"},
        "delivery_info": {
            "exchange": message.delivery_info.get("exchange"),
            "routing_key": message.delivery_info.get("routing_key"),
        },
        "content-type": message.content_type,
    }
    raw["body"] = _decoded(raw)
    return _normalised(raw, clock)


def _decoded(raw: dict[str, Any]) -> Any:
    import base64

    body = raw["body"]
    return _body(
        {
            "body": base64.b64encode(body if isinstance(body, bytes) else body.encode()),
            "headers": raw["headers"],
            "content-type": raw["content-type"],
        }
    )


def _job(app: Celery) -> Any:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> int:
        return x

    return job


@pytest.fixture(params=["redis", "amqp"])
def sent_on(
    request: pytest.FixtureRequest,
    make_app: Callable[..., Celery],
    redis_client: redis.Redis,
) -> Iterator[tuple[Celery, Callable[[frozenset[str]], Sent]]]:
    """An app on each broker, and how to watch what its sends make."""
    if request.param == "amqp":
        app = make_app(broker=request.getfixturevalue("rabbitmq_url"), task_send_sent_event=True)
        yield app, lambda clock: AmqpSent(redis_client, app, clock)
    else:
        app = make_app(task_send_sent_event=True)
        yield app, lambda clock: Sent(redis_client, app, clock)


@pytest.mark.parametrize("case", list(CASES))
def test_a_single_call_sends_what_celery_sends(
    sent_on: tuple[Celery, Callable[[frozenset[str]], Sent]], case: str
) -> None:
    app, watch = sent_on

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, priority=3, time_limit=90)
    def job(x: int) -> int:
        return x

    options_of, by_the_sender, clock = CASES[case]
    with watch(clock) as sent:
        alone = job.apply_async((1,), unique=False, **options_of())
        by_celery = sent.taken(1)
        call = job.apply_async((1,), **options_of())
        by_dedupe = sent.taken(1)

    assert call.deduplicated is False
    assert call.id != alone.id
    assert by_dedupe[0] == by_celery[0]  # the message, on the same queue
    assert by_dedupe[1] == by_celery[1]  # the publish signals' arguments
    assert by_dedupe[2] == by_celery[2]  # task-sent events (Redis broker)
    # The call went the way the case says (so that the comparison covers the sender).
    with app.producer_pool.acquire(block=True) as producer:
        sender = sender_for(Call.of(job, (1,), {}, {}), producer)
        on_redis = producer.channel.__class__.__module__.endswith("redis")
    assert sender is not None
    expected = by_the_sender and (on_redis or case not in _DELAYED)
    assert sender.takes(options_of()) is expected


def test_a_single_call_made_in_a_run_takes_the_runs_ids_and_priority(
    make_app: Callable[..., Celery], redis_client: redis.Redis
) -> None:
    # The sender is made once per task and thread: what a call takes from the run it is
    # made in is read at each call (the same task called outside a run first).
    app = make_app(task_inherit_parent_priority=True)
    job = _job(app)

    made: dict[str, Any] = {}

    @app.task(shared=False)
    def outer() -> None:
        with Sent(redis_client, app, _CLOCK) as sent:
            job.apply_async((1,), unique=False)
            made["by celery"] = sent.taken(0)
            made["call"] = job.apply_async((1,))
            made["by dedupe"] = sent.taken(0)

    with Sent(redis_client, app, _CLOCK) as sent:
        assert job.apply_async((0,)).deduplicated is False  # outside any run, first
        (before,) = sent.taken(0)[0].values()
    run = outer.apply(priority=4)
    assert run.successful(), run.traceback
    assert made["call"].deduplicated is False
    assert made["by dedupe"][0] == made["by celery"][0]
    assert made["by dedupe"][1] == made["by celery"][1]
    (messages,) = made["by dedupe"][0].values()
    assert [m["headers"]["parent_id"] for m in messages] == [run.id]
    assert [m["properties"]["priority"] for m in messages] == [4]
    assert [m["headers"]["parent_id"] for m in before] == [None]


def test_each_thread_sends_with_its_own_reply_to(
    make_app: Callable[..., Celery], redis_client: redis.Redis
) -> None:
    # Celery names each thread's own reply-to; the sender of one thread is not another's.
    app = make_app()
    job = _job(app)

    oids: dict[int, str] = {}
    # Both alive at once (a thread started after another ended may get its id), calling
    # one after the other (the second finds the first's sender made).
    both = threading.Barrier(2, timeout=10)
    first_done = threading.Event()

    def call(x: int) -> None:
        both.wait()
        if x == 2:
            assert first_done.wait(10)
        job.apply_async((x,))
        oids[x] = app.thread_oid
        first_done.set()
        both.wait()

    with Sent(redis_client, app, _CLOCK) as sent:
        threads = [threading.Thread(target=call, args=(x,)) for x in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        (messages,) = sent.taken(0)[0].values()
    by_arg = {m["body"][0][0]: m["properties"]["reply_to"] for m in messages}
    assert by_arg == {1: oids[1], 2: oids[2]}
    assert oids[1] != oids[2]


def test_a_forked_producer_names_itself_as_the_messages_origin(
    make_app: Callable[..., Celery], redis_client: redis.Redis
) -> None:
    # The parent's sender names the parent's process: a child forked after it makes its own.
    app = make_app()
    job = _job(app)

    with Sent(redis_client, app, frozenset()) as sent:
        assert job.apply_async((1,)).deduplicated is False
        child = os.fork()
        if child == 0:  # pragma: no cover (the child)
            try:
                job.apply_async((2,))
            finally:
                os._exit(0)
        _, status = os.waitpid(child, 0)
        assert status == 0
        (messages,) = sent.taken(0)[0].values()
    origins = {m["body"][0][0]: m["headers"]["origin"] for m in messages}
    assert origins[1].startswith(f"gen{os.getpid()}@")
    assert origins[2].startswith(f"gen{child}@")


# -- the queue's declaration --------------------------------------------------------------


def test_an_accepted_call_declares_a_queue_its_connection_never_declared(
    app: Celery, queue_length: Callable[[Celery], int]
) -> None:
    job = _job(app)  # (the app is new: nothing declared its queue yet)
    assert job.apply_async((1,)).deduplicated is False
    assert queue_length(app) == 1


def test_an_accepted_call_declares_its_queue_once_per_connection_as_celery_does(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _job(app)
    declared: list[str] = []
    kombu_declare = Queue.declare

    def declare(queue: Queue, *args: Any, **kwargs: Any) -> Any:
        declared.append(queue.name)
        return kombu_declare(queue, *args, **kwargs)

    monkeypatch.setattr(Queue, "declare", declare)
    assert [job.apply_async((n,)).deduplicated for n in (1, 2, 3)] == [False] * 3
    assert declared == [app.conf.task_default_queue]


def test_an_accepted_call_declares_its_queue_again_on_a_new_connection(
    make_app: Callable[..., Celery], rabbitmq_url: str, queue_length: Callable[[Celery], int]
) -> None:
    # A publish to a queue the broker lost (RabbitMQ drops what no queue is bound for) would
    # leave a record with no message: a new connection's first publish declares again.
    app = make_app(broker=rabbitmq_url)
    job = _job(app)
    assert job.apply_async((1,)).deduplicated is False
    with app.connection_for_write() as connection:
        connection.default_channel.queue_delete(app.conf.task_default_queue)
    with app.producer_pool.acquire(block=True) as producer:
        producer.connection.close()  # (kombu connects again at the next publish)
    assert queue_length(app) == 0
    assert job.apply_async((2,)).deduplicated is False
    assert queue_length(app) == 1
