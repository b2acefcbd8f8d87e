"""Soak: concurrent producers, two prefork workers, children killed as they run.

The short form runs in every test run (about 15 s); DEDUPE_SOAK_SECONDS=300 makes it long.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
import redis

from dedupe.values.header import KeyHeader

from .helpers import WorkerProcess, keys_with_prefix, wait_for

pytestmark = pytest.mark.slow

PRODUCERS = 4
CALLS = 500
KEYS = 20
SECONDS = float(os.environ.get("DEDUPE_SOAK_SECONDS", "12"))


def _produce(soak_id: str, queue: str, seed: int, barrier: Any) -> None:
    from tests import worker_app

    rng = random.Random(seed)
    pause = SECONDS / CALLS
    barrier.wait()
    for _ in range(CALLS):
        key = rng.randrange(KEYS)
        worker_app.soak.apply_async((f"{soak_id}-{key}", 0.05 + (key % 5) * 0.08), queue=queue)
        time.sleep(rng.uniform(0, 2 * pause))


class _Faults:
    """Background threads: one kills a random worker child every few seconds, one samples the
    queue for two messages of one key."""

    def __init__(self, workers: list[WorkerProcess], client: redis.Redis, queue: str) -> None:
        self.workers, self.client, self.queue = workers, client, queue
        self.killed: dict[int, float] = {}
        self.pileups: list[Counter[str]] = []
        self.samples = 0
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._kill_children),
            threading.Thread(target=self._sample_queue),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            if thread.is_alive():
                thread.join()

    def _kill_children(self) -> None:
        rng = random.Random(1)
        while not self.stop.wait(rng.uniform(1.5, 3.0)):
            children = rng.choice(self.workers).child_pids()
            if children:
                pid = rng.choice(children)
                self.killed[pid] = time.time()
                os.kill(pid, signal.SIGKILL)

    def _sample_queue(self) -> None:
        while not self.stop.wait(0.02):
            per_key = Counter(
                KeyHeader.read(json.loads(raw)["headers"]).keys.call  # type: ignore[union-attr]
                for raw in self.client.lrange(self.queue, 0, -1)
            )
            self.samples += 1
            if per_key and max(per_key.values()) > 1:
                self.pileups.append(per_key)


def _drain(worker_app: Any, client: redis.Redis, queue: str) -> None:
    """Every queued call runs, every key frees itself."""
    wait_for(lambda: client.llen(queue) == 0, timeout=60, message="queue drained")
    wait_for(
        lambda: (
            not [k for k in keys_with_prefix(client, worker_app.PREFIX) if b"worker_app.soak:" in k]
        ),
        timeout=3 * worker_app.LEASE + 10,
        message="no key left after drain",
    )


@pytest.mark.soak
def test_soak_no_overlap_no_pileup_no_stuck_key(worker_app: Any, redis_client: redis.Redis) -> None:
    soak_id, queue = f"soak{uuid.uuid4().hex[:8]}", f"soak-{uuid.uuid4().hex[:8]}"
    workers = [WorkerProcess(worker_app.app, env={"DEDUPE_TEST_QUEUE": queue}) for _ in range(2)]
    for worker in workers:
        worker.start()
    faults = _Faults(workers, redis_client, queue)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PRODUCERS)
    producers = [
        context.Process(target=_produce, args=(soak_id, queue, seed, barrier))
        for seed in range(PRODUCERS)
    ]
    try:
        for process in producers:
            process.start()
        faults.start()
        for process in producers:
            process.join(SECONDS * 4 + 60)
            assert process.exitcode == 0
        faults.finish()
        _drain(worker_app, redis_client, queue)
    finally:
        faults.finish()
        for worker in workers:
            worker.stop()

    killed = faults.killed
    overlapping = {}
    runs_per_key = {}
    for key in range(KEYS):
        log = worker_app.runlog(f"{soak_id}-{key}")
        runs_per_key[key] = len(log.runs(killed))
        if found := log.overlaps(killed):
            overlapping[key] = found
    print(
        f"soak: {sum(runs_per_key.values())} runs on {KEYS} keys, {len(killed)} children "
        f"killed, {faults.samples} queue samples"
    )
    assert overlapping == {}
    assert faults.pileups == []
    assert faults.samples > 100
    assert killed, "the soak killed no worker child"
    assert all(count > 0 for count in runs_per_key.values())
