"""The app of the chaos run (tests/chaos/run.py): its workers and producers import it.

Configured from the environment the harness sets. Every run of a task writes its start and end
(RunLog) to the evidence Redis, a server of its own that no fault touches; so do the worker's
main process, for each message it receives (``consumed``: which worker still consumes), and the
child, just before the dedup claim (``prerun``: the earliest moment a run can have freed a
``unique_until="started"`` record), and when the guard defers a delivery (``deferred``: that
delivery's claim was held, and freed nothing). A delivery that ends as ``RETRY`` writes
``retried`` (a deferral, or a debounced message that came before its deadline and was sent
again: either claimed nothing), and a debounced run writes the argument it ran with
(``ran``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import redis
from celery import Celery, signals
from kombu import Queue

import dedupe
from tests.helpers import RunLog, worker_conf

from .evidence import LIMIT, PACED_LIMIT, PACED_RATE, PERIOD, RATE

BROKER = os.environ.get("CHAOS_BROKER", "redis://127.0.0.1:6379/0")
DEDUP = os.environ.get("CHAOS_DEDUP", BROKER)
EVIDENCE = os.environ.get("CHAOS_EVIDENCE", DEDUP)
QUEUE = os.environ.get("CHAOS_QUEUE", "chaos")
PREFIX = os.environ.get("CHAOS_PREFIX", "chaos")
LEASE = float(os.environ.get("CHAOS_LEASE", "10"))
VISIBILITY = float(os.environ.get("CHAOS_VISIBILITY", "30"))
#: The queue of the side producer's calls (its own: a purge empties it mid-run).
SIDE_QUEUE = f"{QUEUE}-side"

app = Celery("chaos_app", broker=BROKER, backend=EVIDENCE.rsplit("/", 1)[0] + "/1")
app.conf.update(
    worker_conf(
        QUEUE,
        DEDUP,
        PREFIX,
        LEASE,
        # A message a killed or cut-off worker held comes back once it is VISIBILITY seconds
        # old, at the next scan (every 10 s; kombu's default scans every tenth time, 100 s).
        broker_transport_options={
            "visibility_timeout": VISIBILITY,
            "unacked_restore_throttle": 1,
            # (A worker killed inside kombu's restore holds every redelivery for 300 s:
            # docs/known-limits.md.)
            "unacked_mutex_expire": 10,
            # RabbitMQ: a publish returns once the broker has the message. Without it a
            # publish written just before the cut is lost with the connection while the call
            # returns as sent, and its confirmed record names a task that never runs (see the
            # README's Known limits); with it, that publish raises and its record is cancelled.
            **({"confirm_publish": True} if BROKER.startswith("amqp") else {}),
        },
        task_ignore_result=True,
        # The purgeable task routed to a queue of its own, which the workers do not consume
        # (its messages wait there for the purge), and which the reaper on RabbitMQ asks.
        task_queues=(Queue(QUEUE, routing_key=QUEUE), Queue(SIDE_QUEUE, routing_key=SIDE_QUEUE)),
        task_routes={"tests.chaos.app.purgeable": {"queue": SIDE_QUEUE}},
        # A record whose message a purge took is freed within about five seconds.
        dedupe_reap_interval=1,
        dedupe_reap_margin=3,
    )
)
evidence = redis.Redis.from_url(EVIDENCE)


@signals.task_prerun.connect(weak=False)
def _prerun(task_id: str = "", **_: Any) -> None:
    # Connected before dedupe.install: runs before the claim.
    evidence.rpush(f"{PREFIX}:prerun", f"{task_id} {time.time()!r} {os.getpid()}")


@signals.task_retry.connect(weak=False)
def _retried(request: Any = None, **_: Any) -> None:
    # In the child, as the delivery ends as RETRY (a deferral, or an early debounced message
    # sent again for its deadline): that delivery holds no claim.
    task_id = getattr(request, "id", "") or ""
    evidence.rpush(f"{PREFIX}:retried", f"{task_id} {time.time()!r} {os.getpid()}")


@dedupe.events.run_deferred.connect(weak=False)
def _deferred(task_id: str = "", **_: Any) -> None:
    evidence.rpush(f"{PREFIX}:deferred", f"{task_id} {time.time()!r} {os.getpid()}")


@dedupe.events.key_reclaimed.connect(weak=False)
def _reclaimed(task_id: str = "", requeued: bool = False, **_: Any) -> None:
    # In the worker's main process: it freed the key of a run it lost (Celery acked the
    # message as failed); a requeued key stays its message's.
    if not requeued:
        evidence.rpush(f"{PREFIX}:freed", f"{task_id} {time.time()!r} {os.getpid()}")


@dedupe.events.redis_unavailable.connect(weak=False)
def _unavailable(task_id: str = "", action: str = "", **_: Any) -> None:
    # Wherever the dedup Redis could not be asked (a producer, a child, a main process):
    # what was done instead ("runs with its message's arguments", "runs unguarded", ...).
    evidence.rpush(f"{PREFIX}:unavailable", f"{task_id} {time.time()!r} {os.getpid()} {action}")


@signals.task_failure.connect(weak=False)
def _failed(task_id: str = "", exception: Any = None, **_: Any) -> None:
    # In the worker's main process, WorkerLostError: the child that had this message died,
    # and Celery acks an acks_late message as failed (no reject_on_worker_lost): it never
    # runs again. Any other failure, in the child: what ended that delivery.
    from billiard.exceptions import WorkerLostError

    at = f"{task_id} {time.time()!r} {os.getpid()}"
    if isinstance(exception, WorkerLostError):
        evidence.rpush(f"{PREFIX}:worker-lost", at)
    else:
        evidence.rpush(f"{PREFIX}:failed", f"{at} {type(exception).__name__}")


@signals.task_received.connect(weak=False)
def _received(**_: Any) -> None:
    # In the worker's main process, whose pid is the worker's.
    evidence.hset(f"{PREFIX}:consumed", os.getpid(), time.time())


dedupe.install(app)


class Warnings(logging.Handler):
    """Keeps the library's warnings (a producer's, a worker's) in the evidence, timed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        line = f"{record.created!r} {os.getpid()} {record.name}: {record.getMessage()}"
        evidence.rpush(f"{PREFIX}:warnings", line)


def runlog(task: str, key: int) -> RunLog:
    """Where the runs of one task's key are written."""
    return RunLog(evidence, f"{PREFIX}:{task}:{key}")


def _run(task: Any, name: str, key: int, seconds: float) -> None:
    log = runlog(name, key)
    log.started(task.request.id)
    time.sleep(seconds)
    log.ended(task.request.id)


common: dict[str, Any] = {"bind": True, "acks_late": True}
guarded: dict[str, Any] = {**common, "base": dedupe.DedupeTask, "unique": True}


@app.task(**guarded, unique_until="finished")
def finished(self: Any, key: int, seconds: float) -> None:
    _run(self, "finished", key, seconds)


@app.task(**guarded, unique_until="started")
def started(self: Any, key: int, seconds: float) -> None:
    _run(self, "started", key, seconds)


#: The debounced task's quiet period and its cap (seconds): short, so that bursts of a
#: producer's calls collapse, and now and then outlast the cap.
DEBOUNCE = 0.3
DEBOUNCE_MAX_WAIT = 1.5


@app.task(
    **guarded,
    unique_on=("key",),
    debounce=DEBOUNCE,
    debounce_max_wait=DEBOUNCE_MAX_WAIT,
)
def debounced(self: Any, key: int, value: int, seconds: float) -> None:
    """A burst's one run: writes the argument it ran with (the burst's latest, taken from
    the dedup Redis) beside its start and end."""
    evidence.rpush(
        f"{PREFIX}:ran", f"{self.request.id} {value} {time.time()!r} {os.getpid()} {key}"
    )
    _run(self, "debounced", key, seconds)


@app.task(**common, base=dedupe.DedupeTask, unique_on=("key",), key_concurrency=LIMIT)
def limited(self: Any, key: int, seconds: float) -> None:
    """At most LIMIT runs of a key at once; every call runs, in call order."""
    _run(self, "limited", key, seconds)


assert PERIOD == 1.0  # (the rate's unit below)


@app.task(**common, base=dedupe.DedupeTask, unique_on=("key",), key_rate_limit=f"{RATE}/s")
def rated(self: Any, key: int, seconds: float) -> None:
    """At most RATE starts of a key in any PERIOD; every call runs."""
    _run(self, "rated", key, seconds)


@app.task(
    **common,
    base=dedupe.DedupeTask,
    unique_on=("key",),
    key_concurrency=PACED_LIMIT,
    key_rate_limit=f"{PACED_RATE}/s",
)
def paced(self: Any, key: int, seconds: float) -> None:
    """Both limits: at most PACED_LIMIT runs of a key at once and at most PACED_RATE starts
    of a key in any PERIOD; every call runs, in call order."""
    _run(self, "paced", key, seconds)


#: The soft time limit of ``interrupted``: it fires in the middle of a call, most of the time.
SOFT_LIMIT = 0.3


@app.task(bind=True, soft_time_limit=SOFT_LIMIT)
def interrupted(self: Any, seed: int, keys: int) -> None:
    """Call the guarded tasks over and over until the soft time limit interrupts a call
    (Celery's SoftTimeLimitExceeded, raised by a signal handler wherever the thread is: in
    the middle of a dedup call, most likely), then make a few calls more. Every call is
    written to the evidence as a producer's: those after the interruption must be answered
    as truly as any."""
    import random

    from celery.exceptions import SoftTimeLimitExceeded

    from .evidence import Call

    rng = random.Random(seed)
    # (A limited call interrupted at its place in line must not hold the line: issue 41.)
    tasks = {"finished": finished, "started": started, "limited": limited}
    made: list[str] = []
    fired = False

    def call() -> None:
        # (A limited call now and then: each is accepted and runs, where the others mostly
        # meet their key held; a line of hundreds would outlast the drain.)
        name = rng.choices(list(tasks), weights=(10, 10, 1))[0]
        key = rng.randrange(keys)
        start = time.time()
        try:
            result = tasks[name].apply_async((key, 0.05 + (key % 5) * 0.08))
        except SoftTimeLimitExceeded:
            made.append(
                Call(
                    name, key, "", False, start, time.time(), "SoftTimeLimitExceeded", os.getpid()
                ).encode()
            )
            raise
        made.append(
            Call(
                name, key, result.id, bool(result.deduplicated), start, time.time(), pid=os.getpid()
            ).encode()
        )

    # Its calls' warnings are a producer's: a call published without dedup (the dedup Redis
    # restarting) holds no key, and the evidence must know it.
    warnings = Warnings()
    logging.getLogger("dedupe").addHandler(warnings)
    try:
        # (Bounded: a limit that fires inside a log call is swallowed by logging's
        # handleError, and an endless loop would hold keys past the drain.)
        deadline = time.monotonic() + 3 * SOFT_LIMIT
        try:
            while time.monotonic() < deadline:
                call()
        except SoftTimeLimitExceeded:
            fired = True
        for _ in range(5 if fired else 0):
            call()
    finally:
        logging.getLogger("dedupe").removeHandler(warnings)
    evidence.rpush(f"{PREFIX}:calls", *made)


@app.task(**guarded)
def purgeable(self: Any, key: int, seconds: float) -> None:
    """The side producer's task, in a queue of its own that a purge empties mid-run."""
    _run(self, "purgeable", key, seconds)


@app.task(**common)
def plain_finished(self: Any, key: int, seconds: float) -> None:
    """The same work without dedupe (``--plain``): the run must find duplicates and overlaps."""
    _run(self, "finished", key, seconds)


@app.task(**common)
def plain_started(self: Any, key: int, seconds: float) -> None:
    _run(self, "started", key, seconds)
