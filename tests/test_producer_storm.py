"""A fork storm of producers SIGKILLed at random points of their calls: no record outlives
its message by more than the provisional ttl, and every accepted call runs.

Producer processes make bursts of calls over many keys (most are accepted) and are killed
at random moments, several rounds over. Then, once the provisional ttl has passed, every key
still held must name a task whose message is in the broker: a worker drains the queue and
every holder, and every call a producer saw accepted, runs.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from celery import Celery

import dedupe

from .conftest import in_process_worker
from .helpers import ROOT, keys_with_prefix, wait_for

pytestmark = pytest.mark.slow

PROVISIONAL_TTL = 2.0
PRODUCERS = 6
ROUNDS = 3
KEYS = 5000
CALLS_PER_PRODUCER = 150

_PRODUCER = textwrap.dedent(
    """
    import random, sys, time
    from celery import Celery
    import dedupe

    broker, dedup, prefix, queue, log, seed, provisional, calls, keys = sys.argv[1:10]
    app = Celery("storm", broker=broker, set_as_current=False)
    app.conf.update(
        dedupe_redis_url=dedup,
        dedupe_key_prefix=prefix,
        task_default_queue=queue,
        dedupe_provisional_ttl=float(provisional),
        broker_transport_options={"confirm_publish": True},
    )
    dedupe.install(app)

    @app.task(base=dedupe.DedupeTask, unique=True, name="storm.job")
    def job(x): ...

    rng = random.Random(int(seed))
    with open(log, "w", buffering=1) as out:
        out.write("ready\\n")
        for _ in range(int(calls)):
            result = job.delay(rng.randrange(int(keys)))
            out.write(("D " if result.deduplicated else "A ") + result.id + "\\n")
            time.sleep(rng.uniform(0, 0.004))
    """
)


def _storm(app: Celery, dedup_url: str, workdir: Path, round_: int) -> list[Path]:
    """One round: start the producers, kill each at a random moment; their logs."""
    broker = str(app.conf.broker_url)
    logs = [workdir / f"round{round_}-producer{index}" for index in range(PRODUCERS)]
    producers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _PRODUCER,
                broker,
                dedup_url,
                app.conf.dedupe_key_prefix,
                app.conf.task_default_queue,
                str(log),
                str(round_ * PRODUCERS + index),
                str(PROVISIONAL_TTL),
                str(CALLS_PER_PRODUCER),
                str(KEYS),
            ],
            cwd=ROOT,
        )
        for index, log in enumerate(logs)
    ]
    rng = random.Random(round_)
    for log in logs:
        wait_for(lambda log=log: log.exists() and log.read_text(), timeout=30, message="ready")
    for process in producers:
        time.sleep(rng.uniform(0.02, 0.15))
        os.kill(process.pid, signal.SIGKILL)
    for process in producers:
        process.wait()
    return logs


def _accepted(logs: list[Path]) -> set[str]:
    return {
        line.split()[1]
        for log in logs
        for line in log.read_text().splitlines()
        if line.startswith("A ")
    }


@pytest.mark.parametrize("kind", ["redis", "amqp"])
def test_producers_killed_mid_call_leave_no_key_without_its_message(
    make_app: Callable[..., Celery],
    redis_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
    kind: str,
    request: pytest.FixtureRequest,
) -> None:
    broker = redis_url if kind == "redis" else request.getfixturevalue("rabbitmq_url")
    app = make_app(broker=broker, dedupe_provisional_ttl=PROVISIONAL_TTL)
    ran = f"ran:{app.conf.dedupe_key_prefix}"

    @app.task(name="storm.job", base=dedupe.DedupeTask, unique=True, shared=False)
    def job(x: int) -> None:
        redis_client.sadd(ran, job.request.id)

    logs = [log for round_ in range(ROUNDS) for log in _storm(app, redis_url, tmp_path, round_)]
    accepted = _accepted(logs)
    assert len(accepted) > PRODUCERS * ROUNDS  # the storm made calls before it was killed

    time.sleep(PROVISIONAL_TTL + 0.5)
    holders = {}
    for key in keys_with_prefix(redis_client, app.conf.dedupe_key_prefix):
        raw = redis_client.get(key)
        if raw is not None:
            holder = dedupe.Holder.from_raw(key.decode(), raw, redis_client.pttl(key))
            holders[holder.task_id] = holder
    if kind == "redis":
        queued = b"".join(redis_client.lrange(app.conf.task_default_queue, 0, -1))
        assert [h for h in holders.values() if h.task_id.encode() not in queued] == []

    with in_process_worker(app, pool="solo"):
        wait_for(
            lambda: keys_with_prefix(redis_client, app.conf.dedupe_key_prefix) == [],
            timeout=120,
            message="every key freed by its run",
        )
    ran_ids = {member.decode() for member in redis_client.smembers(ran)}
    assert set(holders) - ran_ids == set()  # every key named a task that ran
    assert accepted - ran_ids == set()  # every accepted call ran
