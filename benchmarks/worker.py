"""Worker throughput: no-op tasks per second drained by a solo-pool worker in this process
and by a prefork worker of two processes, plain vs dedup, and the peers' workers
(celery-once, celery-singleton: their run-side lock release) when installed, every variant
drained by one worker in the same interleaved rounds. The solo worker also drains the floor
of a guarded run: its claim's and release's Redis I/O alone (benchmarks/_floor.py)."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import redis
from celery import signals

import dedupe

from . import _peers as peers
from ._env import (
    Timings,
    in_process_worker,
    make_app,
    prefork_worker,
    stop_worker,
    worker_node,
)
from ._floor import floor_task


def run(url: str, rounds: int, tasks: int) -> Timings:
    """Tasks per second of each variant, per round, rounds interleaved (a new order each)."""
    app = make_app(url)
    peers.configure(app, url)

    @app.task(shared=False, ignore_result=True)
    def plain_noop(i: int) -> None: ...

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, ignore_result=True)
    def dedupe_noop(i: int) -> None: ...

    # "floor": the claim's and the release's Redis I/O alone, none of dedupe's Python (_floor).
    variants = {
        "plain": plain_noop,
        "dedupe": dedupe_noop,
        "floor": floor_task(app, url, ignore_result=True),
    }
    variants.update(peers.tasks(app, ignore_result=True))
    client = redis.Redis.from_url(url)
    stamps: list[float] = []
    done = threading.Event()

    def on_postrun(**_: Any) -> None:
        stamps.append(time.perf_counter())
        if len(stamps) == tasks:
            done.set()

    samples: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    shuffle = random.Random(20261129).shuffle
    signals.task_postrun.connect(on_postrun, weak=False)
    try:
        with in_process_worker(app, pool="solo") as worker:
            for round_ in range(rounds):
                shuffle(order)
                for name in order:
                    task = variants[name]
                    # Pause consuming, queue the round's tasks, resume: the worker then drains
                    # a full queue. (Remote control: it runs in the worker's own thread.)
                    queue = app.conf.task_default_queue
                    app.control.cancel_consumer(queue, destination=[worker.hostname], reply=True)
                    stamps.clear()
                    done.clear()
                    for i in range(tasks):
                        # A new key each: every call is accepted, every run releases a lock.
                        task.delay(round_ * tasks + i)
                    app.control.add_consumer(queue, destination=[worker.hostname], reply=True)
                    if not done.wait(300):
                        raise RuntimeError(f"{name}: only {len(stamps)} of {tasks} tasks ran")
                    # First to last completion: start-up and consumer set-up excluded.
                    samples[name].append((tasks - 1) / (stamps[-1] - stamps[0]))
    finally:
        signals.task_postrun.disconnect(on_postrun)
        client.delete(app.conf.task_default_queue)
        app.close()
    return Timings(samples)


def run_prefork(url: str, rounds: int, tasks: int) -> Timings:
    """Tasks per second of each variant on a ``celery worker -P prefork -c 2``, per round,
    rounds interleaved (a new order each): from the first run's end to the last's, as the
    worker's processes count them."""
    os.environ["DEDUPE_BENCH_WORKER_REDIS"] = url
    os.environ["DEDUPE_BENCH_WORKER_TASKS"] = str(tasks)
    from . import _worker_app as bench

    client = redis.Redis.from_url(url)
    client.delete(bench.DONE, bench.QUEUE)
    node = worker_node(bench.QUEUE)
    worker = prefork_worker(bench.app, "benchmarks._worker_app", bench.QUEUE, bench.QUEUE, 2)
    samples: dict[str, list[float]] = {name: [] for name in bench.VARIANTS}
    order = list(bench.VARIANTS)
    shuffle = random.Random(20261129).shuffle
    try:
        for round_ in range(rounds):
            shuffle(order)
            for name in order:
                task = bench.VARIANTS[name]
                bench.app.control.cancel_consumer(bench.QUEUE, destination=[node], reply=True)
                for i in range(tasks):
                    task.delay(round_ * tasks + i)
                bench.app.control.add_consumer(bench.QUEUE, destination=[node], reply=True)
                done = client.blpop([bench.DONE], timeout=300)
                if done is None:
                    raise RuntimeError(f"{name}: the prefork worker did not drain {tasks} tasks")
                first, last = map(float, done[1].split())
                samples[name].append((tasks - 1) / (last - first))
    finally:
        stop_worker(worker)
        client.delete(bench.QUEUE)
        bench.app.close()
    return Timings(samples)
