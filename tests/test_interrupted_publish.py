"""A call interrupted on the provisional path leaves its record as true as its message:
- after its enqueue was sent (an exception from a signal handler while it waits for a
  producer of the app's pool), no record: its message was never published, so nothing may
  answer calls of its key with a task id that never runs;
- after the transport took its message, its record, confirmed: the message is queued.
In-process, on RabbitMQ or with the dedup Redis apart from the broker."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from types import FrameType

import pytest
from celery import Celery, signals

import dedupe

from .conftest import RedisFactory


class Interrupted(Exception):
    """What the test's signal handler raises, as Celery's soft time limit does."""


@contextmanager
def _interrupt_after(seconds: float) -> Iterator[None]:
    """SIGUSR1 to this process after ``seconds``, its handler raising :class:`Interrupted` in
    the main thread (pytest-timeout keeps SIGALRM)."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise Interrupted

    before = signal.signal(signal.SIGUSR1, interrupt)
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, before)


def test_a_call_interrupted_while_it_waits_for_a_producer_leaves_its_key_free(
    make_app: Callable[..., Celery], redis_factory: RedisFactory
) -> None:
    store = redis_factory()
    # The broker on the session's Redis, the records on a server of their own: the call
    # sends its provisional enqueue before it takes a producer (the "overlap" path).
    app = make_app(dedupe_redis_url=store.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> int:
        return x

    # A first call: the script is loaded and the store's data-loss marker set, so the next
    # enqueue writes its record as it is sent.
    job.delay(0)
    # Every producer of the app's pool held: the call waits for one until the signal
    # interrupts it. (Not broker_pool_limit=1: Celery sets kombu's limit for every pool of
    # the process, the other tests' apps included.)
    with ExitStack() as held:
        for _ in range(app.producer_pool.limit):
            held.enter_context(app.producer_pool.acquire(block=True))
        with pytest.raises(Interrupted), _interrupt_after(0.3):
            job.delay(1)
    assert dedupe.lookup(job, (1,)) is None
    assert job.delay(1).deduplicated is False


class Halted(BaseException):
    """An interruption no ``except Exception`` stops (KeyboardInterrupt, SystemExit, gevent's
    Timeout), raised as Celery sends ``after_task_publish``: the message is out by then."""


@contextmanager
def _halted_after_the_publish() -> Iterator[None]:
    def halt(**_: object) -> None:
        raise Halted

    signals.after_task_publish.connect(halt, weak=False)
    try:
        yield
    finally:
        signals.after_task_publish.disconnect(halt)


@pytest.mark.parametrize("where", ["rabbitmq", "records apart"])
@pytest.mark.parametrize(
    "before", [0, 9], ids=["read at the push", "decided first (a task of duplicates)"]
)
def test_a_call_interrupted_after_its_message_went_out_keeps_its_record(
    make_app: Callable[..., Celery],
    redis_factory: RedisFactory,
    queue_length: Callable[[Celery], int],
    request: pytest.FixtureRequest,
    where: str,
    before: int,
) -> None:
    if where == "rabbitmq":
        app = make_app(broker=request.getfixturevalue("rabbitmq_url"))
    else:  # (a Redis broker, the records on a server of their own)
        app = make_app(dedupe_redis_url=redis_factory().url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> int:
        return x

    for _ in range(before):
        job.delay(0)
    queued = queue_length(app)
    with _halted_after_the_publish(), pytest.raises(Halted):
        job.delay(1)
    assert queue_length(app) == queued + 1  # (the message is out)
    assert dedupe.lookup(job, (1,)) is not None, "its message is queued, and its key is free"
    assert job.delay(1).deduplicated is True
