"""What every benchmark needs: a Redis, apps, and interleaved timing rounds."""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from celery import Celery

import dedupe
from dedupe.demo.server import RedisServer

#: The repository: where a benchmark's subprocesses run, with it on their path.
ROOT = Path(__file__).resolve().parent.parent


def commandstats(client: Any) -> dict[str, tuple[int, int]]:
    """Calls and microseconds by command since the server started (INFO commandstats), the
    measurement's own INFO left out."""
    return {
        name.removeprefix("cmdstat_"): (int(stat["calls"]), int(stat["usec"]))
        for name, stat in client.info("commandstats").items()
        if name not in ("cmdstat_info", "cmdstat_config|resetstat")
    }


@contextlib.contextmanager
def redis_url(given: str | None) -> Iterator[str]:
    """The given Redis, or a throwaway redis-server for the run."""
    if given:
        yield given
        return
    with RedisServer() as server:
        yield server.url


def make_app(url: str, **conf: Any) -> Celery:
    """An installed app with its own queue and key prefix and no result backend (so that
    the plain publish is as cheap as it gets: ratios against it are the worst case)."""
    suffix = uuid.uuid4().hex[:8]
    app = Celery(f"bench{suffix}", broker=url, set_as_current=False)
    app.conf.update(
        task_default_queue=f"bench-{suffix}",
        dedupe_key_prefix=f"bench-{suffix}",
        broker_connection_retry_on_startup=True,
        **conf,
    )
    dedupe.install(app)
    return app


def worker_app(name: str, url: str, queue: str, **conf: Any) -> Celery:
    """The installed app of a benchmark whose ``celery worker`` runs in a process of its own:
    broker and records on the Redis ``url``, its key prefix ``name``, Celery's root logger
    left alone (the worker's log goes where the benchmark sends it)."""
    app = Celery(name, broker=url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        dedupe_redis_url=url,
        dedupe_key_prefix=name,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        **conf,
    )
    dedupe.install(app)
    return app


def prefork_worker(
    app: Celery, module: str, name: str, queue: str, concurrency: int
) -> subprocess.Popen[bytes]:
    """A real ``celery worker -P prefork`` of ``app`` (defined in ``module``, its settings
    read from the environment this process set), named ``name`` and consuming ``queue``,
    ready when it answers a ping. Its log: ``dedupe-<name>-worker.log`` in the temporary
    folder."""
    log = Path(tempfile.gettempdir()) / f"dedupe-{name}-worker.log"
    command = [sys.executable, "-m", "celery", "-A", module, "worker", "-P", "prefork"]
    command += ["-c", str(concurrency), "-n", f"{name}@%h", "-Q", queue]
    command += ["--without-mingle", "--without-gossip", "--loglevel", "WARNING"]
    with log.open("wb") as out:
        worker = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=out)
    node = worker_node(name)
    deadline = time.monotonic() + 60
    while not app.control.ping([node], timeout=0.5):
        if worker.poll() is not None or time.monotonic() > deadline:
            worker.kill()
            raise RuntimeError(f"the worker {node} did not start (its log: {log})")
    return worker


def worker_node(name: str) -> str:
    """The node name of the worker :func:`prefork_worker` starts as ``name``, on this host."""
    return f"{name}@{socket.gethostname()}"


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """Stop a worker :func:`prefork_worker` started: warm, else killed after 30 s."""
    worker.terminate()
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def in_process_worker(app: Celery, **kwargs: Any) -> Any:
    """A worker thread in this process (celery.contrib.testing)."""
    from celery.contrib.testing.worker import start_worker

    kwargs.setdefault("pool", "solo")
    return start_worker(app, perform_ping_check=False, shutdown_timeout=60, **kwargs)


#: A timed call ``call(i)`` and an untimed reset run after each round (or None).
Variant = tuple[Callable[[int], Any], Callable[[], Any] | None]


class Timings:
    """One sample per round of each variant: microseconds per call, or tasks per second."""

    def __init__(self, samples: dict[str, list[float]]) -> None:
        self.samples = samples

    def median(self, name: str) -> float:
        return statistics.median(self.samples[name])

    def ratio(self, name: str, reference: str) -> float:
        """Median over rounds of the ratio within each round: drift between rounds cancels,
        where a ratio of two medians would keep it."""
        pairs = zip(self.samples[name], self.samples[reference], strict=True)
        return statistics.median(mine / theirs for mine, theirs in pairs)

    def medians(self) -> dict[str, float]:
        return {name: self.median(name) for name in self.samples}


def interleaved(
    variants: dict[str, Variant],
    rounds: int,
    calls: int,
) -> Timings:
    """Time each variant in rounds interleaved (A B C, C A B, ...) so that drift of a shared
    machine hits every variant alike, in a new order every round.

    ``variants`` maps a name to ``(call, reset)``: ``call(i)`` is timed ``calls`` times per
    round; ``reset()`` (untimed) runs after each round.
    """
    samples: dict[str, list[float]] = {name: [] for name in variants}
    counter = 0
    order = list(variants)
    shuffle = random.Random(20261122).shuffle
    for _ in range(rounds):
        # A new order every round: no variant always follows the same neighbour.
        shuffle(order)
        for name in order:
            call, reset = variants[name]
            start = time.perf_counter_ns()
            for _ in range(calls):
                call(counter)
                counter += 1
            samples[name].append((time.perf_counter_ns() - start) / calls / 1000)
            if reset is not None:
                reset()
    return Timings(samples)


def samples_of_script(script: str, *args: str) -> dict[str, list[float]]:
    """Run ``script`` (Python source) in a process of its own, from the repository root and
    with it on the path, with ``args``; the samples it printed as JSON on its last line."""
    root = str(ROOT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=root,
    )
    samples: dict[str, list[float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return samples
