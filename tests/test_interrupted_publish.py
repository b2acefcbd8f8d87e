"""A call interrupted on the provisional path after its enqueue was sent (an exception from a
signal handler while it waits for a producer of the app's pool) leaves no record: its
message was never published, so nothing may answer calls of its key with a task id that
never runs. In-process: the dedup Redis apart from the broker, every producer of the app's
pool held by the test."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from types import FrameType

import pytest
from celery import Celery

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
