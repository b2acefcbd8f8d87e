"""A run cancelled because its worker lost the broker keeps its key for its message.

With ``worker_cancel_long_running_tasks_on_connection_loss = True``, a worker that loses its
broker connection cancels each running ``acks_late`` run it can no longer acknowledge: Celery
SIGTERMs the run's pool child and announces a retry (``Request._announce_cancelled``: the
``task_retry`` signal, ``on_retry``), and the broker gives the unacked message back. A key
tells the truth about its message: while that message waits to be delivered again, the key
stays with it (a new call of the same task and arguments is its duplicate); the redelivered
message runs (it is not dropped as a duplicate of itself); once that run ends, the key is
free; and no two runs of the key overlap, even where the cancelled run goes on cleaning up
while its message comes back.

Two scenarios, each run once for the module: a real ``celery worker -P prefork`` whose broker is
RabbitMQ reached through a proxy process (``tests.chaos.tcp_proxy``) that the test stops, so
that only the worker's broker connection dies; the records in the session's Redis; the test's
producer on RabbitMQ directly. Each test checks one thing the scenario recorded.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Connection

import dedupe

from .helpers import WorkerProcess, fail_on_keys_left, producer_stub, wait_for
from .proxies import RABBITMQ_PORT, ProxyProcess

pytestmark = [pytest.mark.slow]

#: The setting under test. The worker reads it from this very module, named as its
#: configuration module (Celery's ``CELERY_CONFIG_MODULE``): tests.worker_app leaves it off.
worker_cancel_long_running_tasks_on_connection_loss = True

#: How long the first delivery would run (it is cancelled long before).
FIRST_RUN = 60.0


@dataclass
class Scenario:
    """What the test saw at each step."""

    tag: str = ""
    task_id: str = ""
    #: The key while the first delivery ran: (state, task id).
    while_running: tuple[str, str] | None = None
    #: The worker said it cancelled the run, and its child is gone.
    cancelled: bool = False
    #: Messages in the queue once the run was cancelled (the worker cut off).
    queued_after_cancel: int | None = None
    #: The key once the run was cancelled, while its message waits: (state, task id), or None.
    after_cancel: tuple[str, str] | None = None
    #: A new call of the same task and arguments then: (deduplicated, its task id).
    again: tuple[bool, str] | None = None
    #: The first message's result, once the worker is back.
    result: Any = None
    #: (task id, start, end) of every run of the key, a killed run ending when it was killed.
    runs: list[tuple[str, float, float | None]] = field(default_factory=list)
    overlaps: list[Any] = field(default_factory=list)
    #: The key once every run ended: (state, task id), or None.
    after_runs: tuple[str, str] | None = None


def _state(holder: Any) -> tuple[str, str] | None:
    return None if holder is None else (holder.state, holder.task_id)


def _queue_length(url: str, queue: str) -> int:
    """Messages ready in ``queue``, read on a connection of its own (not the proxy's)."""
    with Connection(url, connect_timeout=2) as connection:
        _, count, _ = connection.default_channel.queue_declare(queue, passive=True)
        return int(count)


def _gone(pid: int) -> bool:
    """Has the process ``pid`` ended (gone, or a zombie not reaped yet)?"""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"  # (a zombie: it ended)
    except FileNotFoundError:
        return True


@dataclass
class Rig:
    """A prefork worker whose broker connection goes through :attr:`proxy`, and the test's
    producer of ``task`` (on RabbitMQ directly)."""

    tag: str
    queue: str
    task: Any
    worker: WorkerProcess
    proxy: ProxyProcess
    client: redis.Redis

    def key(self, *args: Any) -> tuple[str, str] | None:
        return _state(dedupe.lookup(self.task, (self.tag, *args)))

    def cut_until_cancelled(self) -> None:
        """Cut the worker's broker connection; return once Celery cancelled the run."""
        self.proxy.stop()  # (RabbitMQ takes the unacked message back as the connection dies)
        wait_for(
            lambda: "Terminating it instead" in self.worker.tail(),
            timeout=15,
            message="the worker's cancel of the run",
        )


@contextlib.contextmanager
def _rig(worker_app: Any, rabbitmq_url: str, task_name: str) -> Iterator[Rig]:
    tag = uuid.uuid4().hex[:12]
    queue, prefix = f"cancelled-{tag}", f"cancel{tag[:6]}"
    client = redis.Redis.from_url(worker_app.REDIS)
    proxy = ProxyProcess(RABBITMQ_PORT)
    proxy.start()
    producer = Celery(
        "worker_app", broker=rabbitmq_url, backend=worker_app.REDIS, set_as_current=False
    )
    producer.conf.update(
        task_default_queue=queue,
        dedupe_redis_url=worker_app.REDIS,
        dedupe_key_prefix=prefix,
        dedupe_default_lease=worker_app.LEASE,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"confirm_publish": True},
    )
    dedupe.install(producer)
    task = producer_stub(producer, getattr(worker_app, task_name), acks_late=True)
    env = {
        "DEDUPE_TEST_BROKER": f"amqp://guest:guest@127.0.0.1:{proxy.port}//",
        "DEDUPE_TEST_QUEUE": queue,
        "DEDUPE_TEST_PREFIX": prefix,
        "CELERY_CONFIG_MODULE": __name__,
    }
    worker = WorkerProcess(producer, env)
    try:
        worker.start()
        yield Rig(tag, queue, task, worker, proxy, client)
    finally:
        if proxy.process is None:
            proxy.start()  # (the worker stops through its broker)
        worker.stop()
        proxy.stop()
        try:
            fail_on_keys_left(client, prefix, within=3 * worker_app.LEASE + 3)
        finally:
            with producer.connection_for_write() as connection:
                connection.default_channel.queue_delete(queue)
            producer.close()
            client.close()


@pytest.fixture(scope="module")
def scenario(worker_app: Any, rabbitmq_url: str) -> Iterator[Scenario]:
    with _rig(worker_app, rabbitmq_url, "redelivered") as rig:
        tag, task = rig.tag, rig.task
        seen = Scenario(tag=tag)
        # tests.worker_app's `redelivered`: unique, acks_late; its first delivery sleeps for
        # the seconds asked, a later one for a second.
        result = task.delay(tag, FIRST_RUN)
        seen.task_id = result.id
        wait_for(lambda: worker_app.runlog(tag).runs(), message="the first delivery's run")
        child = int(rig.client.get(f"pid:{tag}") or 0)
        seen.while_running = rig.key(FIRST_RUN)

        rig.cut_until_cancelled()
        wait_for(lambda: _gone(child), timeout=15, message="the cancelled run's child's end")
        killed_at = time.time()
        seen.cancelled = True
        # (RabbitMQ takes an unacked message back as the connection closes: a moment.)
        seen.queued_after_cancel = _queue_length(rabbitmq_url, rig.queue)
        deadline = time.monotonic() + 5
        while seen.queued_after_cancel != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
            seen.queued_after_cancel = _queue_length(rabbitmq_url, rig.queue)
        seen.after_cancel = rig.key(FIRST_RUN)
        again = task.delay(tag, FIRST_RUN)
        seen.again = (bool(again.deduplicated), again.id)

        rig.proxy.start()  # the worker reconnects, and the message comes to it again
        seen.result = result.get(timeout=30)
        if again.id != result.id:  # (a call accepted beside it: let it end too)
            again.get(timeout=30)
        runlog = worker_app.runlog(tag)
        seen.runs = runlog.runs({child: killed_at})
        seen.overlaps = runlog.overlaps({child: killed_at})
        # (A run frees its key before Celery stores its result: no wait.)
        seen.after_runs = rig.key(FIRST_RUN)
        yield seen


def test_the_worker_cancels_the_run_and_its_message_goes_back_to_the_queue(
    scenario: Scenario,
) -> None:
    # Celery's part, which the tests below stand on.
    assert scenario.while_running == ("running", scenario.task_id)
    assert scenario.cancelled
    assert scenario.queued_after_cancel == 1


def test_the_key_stays_with_the_cancelled_message_while_it_waits_for_its_redelivery(
    scenario: Scenario,
) -> None:
    assert scenario.after_cancel is not None, "the key was freed while its message waits"
    assert scenario.after_cancel[1] == scenario.task_id


def test_a_call_while_the_cancelled_message_waits_is_its_duplicate(scenario: Scenario) -> None:
    assert scenario.again == (True, scenario.task_id)


def test_the_redelivered_message_runs(scenario: Scenario) -> None:
    assert scenario.result == scenario.tag
    assert [run[0] for run in scenario.runs if run[0] == scenario.task_id] == [
        scenario.task_id,
        scenario.task_id,
    ]


def test_the_key_is_free_once_the_redelivered_run_ended(scenario: Scenario) -> None:
    assert scenario.after_runs is None


def test_no_two_runs_of_the_key_overlap(scenario: Scenario) -> None:
    assert scenario.overlaps == []


#: Seconds the first run of `cleans_up_when_stopped` takes to unwind once stopped.
CLEANUP = 3.0


@dataclass
class CleaningUp:
    """A cancelled run that goes on cleaning up while its message comes back."""

    task_id: str = ""
    #: The key while the cancelled run cleaned up: (state, task id), or None.
    while_cleaning: tuple[str, str] | None = None
    result: Any = None
    runs: list[tuple[str, float, float | None]] = field(default_factory=list)
    overlaps: list[Any] = field(default_factory=list)


@pytest.fixture(scope="module")
def cleaning_up(worker_app: Any, rabbitmq_url: str) -> Iterator[CleaningUp]:
    with _rig(worker_app, rabbitmq_url, "cleans_up_when_stopped") as rig:
        seen = CleaningUp()
        result = rig.task.delay(rig.tag, FIRST_RUN, CLEANUP)
        seen.task_id = result.id
        wait_for(lambda: worker_app.runlog(rig.tag).runs(), message="the first delivery's run")
        rig.cut_until_cancelled()
        seen.while_cleaning = rig.key(FIRST_RUN, CLEANUP)
        rig.proxy.start()  # at once: the message comes back while the first run cleans up
        seen.result = result.get(timeout=30)
        runlog = worker_app.runlog(rig.tag)
        seen.runs, seen.overlaps = runlog.runs(), runlog.overlaps()
        yield seen


def test_a_cancelled_run_that_cleans_up_keeps_its_key_meanwhile(cleaning_up: CleaningUp) -> None:
    assert cleaning_up.while_cleaning == ("running", cleaning_up.task_id)


def test_the_redelivery_of_a_cancelled_run_waits_for_its_cleanup(cleaning_up: CleaningUp) -> None:
    # Two runs of the message, one after the other: the redelivery came while the first
    # still unwound, and waited for it.
    assert [run[0] for run in cleaning_up.runs] == [cleaning_up.task_id] * 2
    assert cleaning_up.overlaps == []
