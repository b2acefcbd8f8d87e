"""A run that must go again later sends its message again under the same task id; when that
publish fails (the broker cut), an acks_late message goes back to the broker and is delivered
again: the call is not lost. A real prefork worker whose writes to the broker go through a
proxy the test cuts (``CELERY_BROKER_WRITE_URL``); its deliveries come on the broker itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from .helpers import WorkerProcess, wait_for
from .proxies import ProxyProcess
from .test_flow_lines import forget_started

pytestmark = [pytest.mark.slow]


@pytest.fixture
def cut_writes(worker_app: Any, tag: str) -> Iterator[tuple[str, ProxyProcess, WorkerProcess]]:
    broker = urlsplit(str(worker_app.app.conf.broker_url))
    proxy = ProxyProcess(broker.port or 6379)
    proxy.start()
    queue = f"send-again-{tag}"
    write_url = f"redis://127.0.0.1:{proxy.port}{broker.path}"
    worker = WorkerProcess(
        worker_app.app,
        {"DEDUPE_TEST_QUEUE": queue, "CELERY_BROKER_WRITE_URL": write_url},
        concurrency=4,  # (a free process for the run that waits)
    )
    worker.start()
    try:
        yield queue, proxy, worker
    finally:
        if proxy.process is None:
            proxy.start()  # (the worker stops through its broker)
        worker.stop()
        proxy.stop()


def test_a_waiting_call_whose_hand_off_is_cut_runs_once_the_broker_is_back(
    worker_app: Any, tag: str, cut_writes: tuple[str, ProxyProcess, WorkerProcess]
) -> None:
    queue, proxy, worker = cut_writes
    task = worker_app.two_at_once  # (key_concurrency=2, acks_late)
    holding = [task.apply_async((tag, index, 3.0), queue=queue) for index in (0, 1)]
    wait_for(lambda: len(worker_app.runlog(tag).runs()) == 2, message="both slots taken")
    # A countdown: its message comes to the worker with no slot, and waits there in line
    # (held in Redis with Celery's options): the worker publishes it when a slot frees.
    waiting = task.apply_async((tag, 2, 0.0), queue=queue, countdown=0.1)
    wait_for(
        lambda: f"{waiting.id}] waits its turn" in worker.log.read_text(errors="replace"),
        message="its run met the full slots, and waits in line",
    )
    proxy.stop()  # the worker can no longer publish
    wait_for(
        lambda: f"{waiting.id} was handed a slot" in worker.log.read_text(errors="replace"),
        message="a slot freed, handed to it, and its publish failed",
        timeout=20,
    )
    proxy.start()
    assert [result.get(timeout=30) for result in holding] == [0, 1]
    assert waiting.get(timeout=30) == 2  # (its handed slot lapsed, and went to it again)
    assert waiting.id in {run[0] for run in worker_app.runlog(tag).runs()}
    forget_started(worker_app)
