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

from .helpers import WorkerProcess, keys_with_prefix, wait_for

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


@pytest.mark.soak
def test_soak_no_overlap_no_pileup_no_stuck_key(worker_app: Any, redis_client: redis.Redis) -> None:
    soak_id, queue = f"soak{uuid.uuid4().hex[:8]}", f"soak-{uuid.uuid4().hex[:8]}"
    workers = [WorkerProcess(worker_app.app, env={"DEDUPE_TEST_QUEUE": queue}) for _ in range(2)]
    for worker in workers:
        worker.start()
    killed: dict[int, float] = {}
    pileups: list[Counter[str]] = []
    samples = 0
    stop = threading.Event()

    def kill_children() -> None:
        rng = random.Random(1)
        while not stop.wait(rng.uniform(1.5, 3.0)):
            worker = rng.choice(workers)
            children = worker.child_pids()
            if children:
                pid = rng.choice(children)
                killed[pid] = time.time()
                os.kill(pid, signal.SIGKILL)

    def sample_queue() -> None:
        nonlocal samples
        while not stop.wait(0.02):
            per_key = Counter(
                json.loads(raw)["headers"]["celery_dedupe"]["key"]
                for raw in redis_client.lrange(queue, 0, -1)
            )
            samples += 1
            if per_key and max(per_key.values()) > 1:
                pileups.append(per_key)

    threads = [threading.Thread(target=kill_children), threading.Thread(target=sample_queue)]
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PRODUCERS)
    producers = [
        context.Process(target=_produce, args=(soak_id, queue, seed, barrier))
        for seed in range(PRODUCERS)
    ]
    try:
        for process in producers:
            process.start()
        for thread in threads:
            thread.start()
        for process in producers:
            process.join(SECONDS * 4 + 60)
            assert process.exitcode == 0
        stop.set()
        for thread in threads:
            thread.join()
        # Drain: every queued call runs, every key frees itself.
        wait_for(lambda: redis_client.llen(queue) == 0, timeout=60, message="queue drained")
        wait_for(
            lambda: (
                not [
                    k
                    for k in keys_with_prefix(redis_client, worker_app.PREFIX)
                    if b"worker_app.soak:" in k
                ]
            ),
            timeout=3 * worker_app.LEASE + 10,
            message="no key left after drain",
        )
    finally:
        stop.set()
        for worker in workers:
            worker.stop()

    overlapping = {}
    runs_per_key = {}
    for key in range(KEYS):
        log = worker_app.runlog(f"{soak_id}-{key}")
        runs_per_key[key] = len(log.runs(killed))
        if found := log.overlaps(killed):
            overlapping[key] = found
    print(
        f"soak: {sum(runs_per_key.values())} runs on {KEYS} keys, {len(killed)} children "
        f"killed, {samples} queue samples"
    )
    assert overlapping == {}
    assert pileups == []
    assert samples > 100
    assert killed, "the soak killed no worker child"
    assert all(count > 0 for count in runs_per_key.values())
