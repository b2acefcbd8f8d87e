"""The app that real ``celery worker`` subprocesses run in the tests (and that tests call).

Configured from the environment that tests/conftest.py sets before anything imports it.
Every task writes when its runs start and end (RunLog), keyed by a ``tag`` argument, and
stores its pid so that tests can kill or pause the process that runs it.

Tasks whose ending a test checks (success, failure, Ignore, Reject, retries exhausted, a
soft time limit) hold a 30 s lease: their key is gone in time for the tests' no-key-left
check only if that ending released it, not because a short lease ran out.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import redis
from celery import Celery
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded
from celery.signals import after_task_publish, task_postrun

import dedupe

from .helpers import RunLog, worker_conf

BROKER = os.environ.get("DEDUPE_TEST_BROKER", "redis://127.0.0.1:6379/0")
REDIS = os.environ.get("DEDUPE_TEST_REDIS", BROKER)
#: The dedup store: REDIS, unless a test gives the worker one of its own (to restart it).
STORE = os.environ.get("DEDUPE_TEST_STORE", REDIS)
PREFIX = os.environ.get("DEDUPE_TEST_PREFIX", "wk")
QUEUE = os.environ.get("DEDUPE_TEST_QUEUE", "dedupe-prefork")
LEASE = float(os.environ.get("DEDUPE_TEST_LEASE", "2"))
#: The Redis broker's visibility timeout, for workers whose test waits for a redelivery
#: (unset: kombu's hour).
VISIBILITY = os.environ.get("DEDUPE_TEST_VISIBILITY")
#: The lease of tasks whose ending is under test (see above).
ENDING_LEASE = 30.0

app = Celery("worker_app", broker=BROKER, backend=REDIS)
app.conf.update(worker_conf(QUEUE, STORE, PREFIX, LEASE, result_expires=600))
if VISIBILITY:
    # Restore unacked messages as soon as the timeout has passed (kombu sweeps every 100 s).
    app.conf.broker_transport_options = {
        "visibility_timeout": float(VISIBILITY),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        # kombu's restore takes a broker-wide lock (every second here) that a worker killed
        # inside it holds for 300 s: the next test's redelivery waited that long (seen in
        # CI: the test timed out; a held lock reproduces it). kombu's, not ours
        # (docs/known-limits.md); a sweep takes milliseconds.
        "unacked_mutex_expire": 10,
    }


@task_postrun.connect(weak=False)
def _slow_receiver(task: Any = None, **_: Any) -> None:
    # Another library's task_postrun receiver, connected before dedupe's (an APM flush, a
    # database connection closed): it runs after the result is stored, before dedupe's own.
    if getattr(task, "name", "") == "tests.worker_app.ok_behind_a_slow_receiver":
        time.sleep(0.05)


dedupe.install(app)

if os.environ.get("DEDUPE_TEST_METRICS_PORT"):
    # A worker of the Prometheus test: its children's counters summed by the main process.
    import dedupe.prometheus

    dedupe.prometheus.enable(app, port=int(os.environ["DEDUPE_TEST_METRICS_PORT"]))

_events = redis.Redis.from_url(REDIS)


@dedupe.events.key_reclaimed.connect(weak=False)
def _reclaimed(task_id: str = "", key: str = "", **_: Any) -> None:
    # Tests read what the pool's parent reclaimed, in their own process.
    _events.rpush(f"reclaimed:{task_id}", key)


@dedupe.events.run_deferred.connect(weak=False)
def _deferred(task_id: str = "", **_: Any) -> None:
    # Tests wait for a message to be deferred (it then waits in its worker for its next try).
    _events.rpush(f"deferred:{task_id}", time.time())


def runlog(tag: str) -> RunLog:
    return RunLog(_events, tag)


def _run(task: Any, tag: str, seconds: float = 0.0) -> None:
    log = runlog(tag)
    _events.set(f"pid:{tag}", os.getpid())
    log.started(task.request.id)
    time.sleep(seconds)
    log.ended(task.request.id)


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=ENDING_LEASE)
def ok(self: Any, tag: str, seconds: float = 0.0) -> str:
    _run(self, tag, seconds)
    return tag


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=ENDING_LEASE)
def ok_behind_a_slow_receiver(self: Any, tag: str) -> str:
    _run(self, tag)
    return tag


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=ENDING_LEASE)
def calls_itself(self: Any, tag: str, depth: int) -> str:
    """Calls its own function within its run (recursion), then says its key's state."""
    if depth:
        calls_itself(tag, depth - 1)
    holder = dedupe.lookup(calls_itself, (tag, depth))
    return holder.state if holder else "free"


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=ENDING_LEASE)
def cuts_its_chain(self: Any, tag: str) -> str:
    """Stops the chain it leads, as Celery's docs show: the next task never runs."""
    self.request.chain = None
    _run(self, tag)
    return tag


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=ENDING_LEASE)
def fail(self: Any, tag: str) -> None:
    _run(self, tag)
    raise ValueError(tag)


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, max_retries=5)
def retry_then_ok(self: Any, tag: str, times: int, countdown: float = 0.5) -> int:
    _run(self, tag)
    if self.request.retries < times:
        raise self.retry(countdown=countdown)
    return int(self.request.retries)


@app.task(bind=True, base=dedupe.DedupeTask, unique=True)
def retries_into_a_failed_publish(self: Any, tag: str) -> None:
    """Retries with a serializer nobody registered: the retry's publish fails before it sends
    anything, and Celery rejects the message (requeue=False): no run comes after this one."""
    _run(self, tag)
    raise self.retry(countdown=1, serializer="dedupe-test-unregistered")


@app.task(bind=True, base=dedupe.DedupeTask, unique=True)
def replaces_into_a_failed_publish(self: Any, tag: str) -> None:
    """Replaced by the same call, published with a serializer nobody registered: the
    replacement never exists, and the body fails with the publish's error."""
    _run(self, tag)
    raise self.replace(self.si(tag).set(serializer="dedupe-test-unregistered"))


class _Halted(BaseException):
    """An interruption no ``except Exception`` stops, raised as Celery sends
    ``after_task_publish``: the message it follows is out."""


def _halt(**_: object) -> None:
    raise _Halted


@app.task(bind=True, base=dedupe.DedupeTask, unique=True)
def replaced_then_interrupted(self: Any, tag: str) -> str:
    """The first run replaces itself with the same call, three seconds on, and is interrupted
    once that message is out: its key is the replacement's; the replacement just runs."""
    _run(self, tag)
    if _events.incr(f"deliveries:{tag}") > 1:
        return "replacement"
    after_task_publish.connect(_halt, weak=False)
    try:
        self.replace(self.si(tag).set(countdown=3))
    except _Halted:
        return "interrupted"
    finally:
        after_task_publish.disconnect(_halt)
    return "replaced"


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=ENDING_LEASE, max_retries=2)
def retry_forever(self: Any, tag: str) -> None:
    _run(self, tag)
    raise self.retry(countdown=0.1)


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=ENDING_LEASE)
def ignore(self: Any, tag: str) -> None:
    _run(self, tag)
    raise Ignore()


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=ENDING_LEASE, acks_late=True)
def reject(self: Any, tag: str, requeue: bool) -> str:
    _run(self, tag)
    if _events.incr(f"deliveries:{tag}") == 1:
        raise Reject("first delivery", requeue=requeue)
    return "second delivery"


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=ENDING_LEASE)
def reject_unacked(self: Any, tag: str) -> None:
    """Reject(requeue=True) without acks_late: the message was acked already, and is lost."""
    _run(self, tag)
    raise Reject("requeue asked, but the message was acked when it was received", requeue=True)


@app.task(bind=True, base=dedupe.DedupeTask, unique=True)
def sleepy(self: Any, tag: str, seconds: float) -> str:
    _run(self, tag, seconds)
    return tag


@app.task(
    bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=ENDING_LEASE, soft_time_limit=1
)
def soft_limited(self: Any, tag: str) -> None:
    _run(self, tag, 5)


@app.task(bind=True, soft_time_limit=0.4)
def calls_until_soft_limit(self: Any, tag: str) -> dict[str, Any]:
    """Repeat a duplicate call of ``ok`` until the soft time limit fires (in the middle of a
    dedup call, nearly always: the loop does nothing else), then make calls whose answers are
    known: new keys must be accepted, the held call a duplicate of its holder."""
    held = ok.apply_async((f"{tag}-held",), countdown=2)
    repeats = 0
    # (Bounded: a limit that fires inside a log call is swallowed by logging's handleError.)
    deadline = time.monotonic() + 1.5
    try:
        while time.monotonic() < deadline:
            ok.apply_async((f"{tag}-held",), countdown=2)
            repeats += 1
    except SoftTimeLimitExceeded:
        pass
    wrong = []
    for index in range(20):
        fresh = ok.delay(f"{tag}-after-{index}")
        if fresh.deduplicated:
            wrong.append(f"a new call answered as a duplicate of {fresh.id}")
        again = ok.apply_async((f"{tag}-held",), countdown=2)
        if again.id != held.id:
            wrong.append(
                f"the held call answered with {again.id} (deduplicated={again.deduplicated})"
            )
    return {"repeats": repeats, "wrong": wrong}


#: The soft time limit of ``accepted_when_its_limit_fires``; the test holds Redis's answer longer.
INTERRUPTING_LIMIT = 0.5
#: The calls ``accepted_when_its_limit_fires`` makes before the one interrupted.
CALLS_BEFORE = {"duplicates": 9, "busy": 1, "first": 0}


@app.task(bind=True, soft_time_limit=INTERRUPTING_LIMIT)
def accepted_when_its_limit_fires(
    self: Any, tag: str, before: str, task_id: str | None = None
) -> str:
    """A call of ``ok(f"{tag}-new")`` (with ``task_id``, if given) whose answer the test's
    proxy holds until the soft time limit has interrupted it, made after ``before``:
    "duplicates" (nine calls of one key: the task decides before it publishes), "busy" (a
    call just before: the enqueue is sent, and read at the push), "first" (none: the process
    has not run the enqueue script yet, so it waits for its reply). Those calls run after
    this one (the worker has one child)."""
    for _ in range(CALLS_BEFORE[before]):
        ok.delay(f"{tag}-held")
    try:
        ok.apply_async((f"{tag}-new",), task_id=task_id)
    except SoftTimeLimitExceeded:
        return "interrupted"
    return "answered"


@app.task(
    bind=True, base=dedupe.DedupeTask, unique=True, acks_late=True, reject_on_worker_lost=True
)
def redelivered(self: Any, tag: str, seconds: float) -> str:
    # The redelivery runs for a second, long enough to be seen holding the key.
    _run(self, tag, seconds if _events.incr(f"deliveries:{tag}") == 1 else 1)
    return tag


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, acks_late=True)
def cleans_up_when_stopped(self: Any, tag: str, seconds: float, cleanup: float) -> str:
    """:func:`redelivered` whose first run, stopped (its process's SystemExit, say), takes
    ``cleanup`` seconds more to unwind: it still runs then."""
    first = _events.incr(f"deliveries:{tag}") == 1
    log = runlog(tag)
    _events.set(f"pid:{tag}", os.getpid())
    log.started(self.request.id)
    try:
        time.sleep(seconds if first else 1)
    finally:
        if first:
            time.sleep(cleanup)
        log.ended(self.request.id)
    return tag


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique=True,
    unique_lease=ENDING_LEASE,
    acks_late=True,
    reject_on_worker_lost=True,
)
def redelivered_long_lease(self: Any, tag: str, seconds: float) -> str:
    """:func:`redelivered` with a 30 s lease: its redelivery after a killed child starts
    within seconds only if it takes over its dead run's key, not if it waits out the lease."""
    _run(self, tag, seconds if _events.incr(f"deliveries:{tag}") == 1 else 1)
    return tag


@app.task(
    bind=True, base=dedupe.DedupeTask, unique=True, unique_until="started", on_running_countdown=0.2
)
def started_mode(self: Any, tag: str, seconds: float) -> str:
    _run(self, tag, seconds)
    return tag


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique=True,
    unique_until="started",
    acks_late=True,
    on_running_countdown=0.2,
)
def started_acks_late(self: Any, tag: str, seconds: float) -> str:
    _run(self, tag, seconds)
    return tag


#: Seconds a deferred ``waits_its_turn`` message waits in its worker for its next try.
WAITS_ITS_TURN = 8.0


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique=True,
    unique_until="started",
    on_running_countdown=WAITS_ITS_TURN,
)
def waits_its_turn(self: Any, tag: str, seconds: float) -> str:
    _run(self, tag, seconds)
    return tag


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, rate_limit="6/m")
def rate_limited(self: Any, tag: str) -> str:
    """One run per 10 s: a second message waits in the worker's token bucket."""
    _run(self, tag)
    return tag


@app.task(bind=True, base=dedupe.DedupeTask, unique=True)
def soak(self: Any, tag: str, seconds: float) -> None:
    _run(self, tag, seconds)


@app.task(bind=True)
def plain_sleepy(self: Any, tag: str, seconds: float) -> str:
    """Not a DedupeTask: only a deduplicating scheduler (or dedupe.apply_async) guards it."""
    _run(self, tag, seconds)
    return tag


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique=True,
    time_limit=1,
    acks_late=True,
    acks_on_failure_or_timeout=False,
)
def hard_limited_redelivered(self: Any, tag: str) -> str:
    """Killed by its hard time limit on the first delivery; Celery requeues the message."""
    first = _events.incr(f"deliveries:{tag}") == 1
    _run(self, tag, 5 if first else 0)
    return tag


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=30)
def sleepy_long_lease(self: Any, tag: str, seconds: float) -> str:
    """A 30 s lease: its key frees within seconds only if the main process frees it."""
    _run(self, tag, seconds)
    return tag


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=30)
def swallows_its_stop(self: Any, tag: str, seconds: float) -> str:
    """Swallows the SystemExit of its process's terminate, and returns: the process lives on
    (billiard's terminate flag still set) and runs what comes next."""
    try:
        _run(self, tag, seconds)
    except SystemExit:
        _events.set(f"swallowed:{tag}", 1)
    return tag


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=30)
def slow_to_stop(self: Any, tag: str, seconds: float) -> str:
    """Takes a second and a half to unwind from its process's terminate."""
    try:
        _run(self, tag, seconds)
    except SystemExit:
        time.sleep(1.5)
        raise
    return tag


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique=True,
    unique_until="started",
    unique_lease=30,
    on_running_countdown=0.2,
)
def started_long_lease(self: Any, tag: str, seconds: float) -> str:
    """unique_until="started" (its run lock a key of its own) with a 30 s lease."""
    _run(self, tag, seconds)
    return tag


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=30, time_limit=1)
def hard_limited_long_lease(self: Any, tag: str) -> None:
    _run(self, tag, 5)


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=30, time_limit=1)
def hard_limited_deaf(self: Any, tag: str) -> None:
    """Deaf to SIGTERM: its hard time limit ends in SIGKILL, so no task_postrun runs in the
    child and only the pool's parent can free its key (the child dies with it)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _run(self, tag, 5)


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique=True,
    unique_lease=30,
    retry_on_worker_lost=True,
    default_retry_delay=0.5,
    max_retries=2,
)
def lost_then_retried(self: Any, tag: str) -> str:
    """Sleeps on its first run (the test kills it); Celery 5.7 retries it then."""
    _run(self, tag, 30 if _events.incr(f"deliveries:{tag}") == 1 else 0)
    return tag


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=30)
def cleans_up_when_told_to_stop(self: Any, tag: str, cleanup: float) -> None:
    """Runs until a SIGUSR1 (a terminating revoke's soft signal), then cleans up a while."""
    log = runlog(tag)
    _events.set(f"pid:{tag}", os.getpid())
    log.started(self.request.id)
    try:
        time.sleep(30)
    except SoftTimeLimitExceeded:
        time.sleep(cleanup)
    log.ended(self.request.id)


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_lease=30, on_running_countdown=0.3)
def retries_and_goes_on(self: Any, tag: str, seconds: float) -> None:
    """Sends its retry without raising it (throw=False), then works on for ``seconds``."""
    log = runlog(tag)
    log.started(self.request.id)
    if self.request.retries == 0:
        self.retry(countdown=0, throw=False)
        time.sleep(seconds)
    log.ended(self.request.id)


def _ran_with(task: Any, tag: str, value: Any, seconds: float) -> Any:
    _events.rpush(f"values:{tag}", f"{task.request.id} {value}")
    _run(task, tag, seconds)
    return value


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_on=("tag",), debounce=1)
def debounced(self: Any, tag: str, value: Any, seconds: float = 0.0) -> Any:
    """Debounced per tag: a burst of calls runs once, with the last call's value."""
    return _ran_with(self, tag, value, seconds)


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique=True,
    unique_on=("tag",),
    debounce=1,
    debounce_max_wait=3,
)
def debounced_capped(self: Any, tag: str, value: Any, seconds: float = 0.0) -> Any:
    """Debounced per tag, and run at least every 3 s of an endless burst."""
    return _ran_with(self, tag, value, seconds)


@app.task(
    bind=True, base=dedupe.DedupeTask, unique=True, unique_on=("tag",), on_duplicate="replace"
)
def replaced(self: Any, tag: str, value: Any, seconds: float = 0.0) -> Any:
    """A duplicate made while the call is queued replaces its value."""
    return _ran_with(self, tag, value, seconds)


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique=True,
    unique_on=("tag",),
    on_duplicate="replace",
    unique_until="started",
)
def replaced_after_run(self: Any, tag: str, value: Any, seconds: float = 0.0) -> Any:
    """Calls made during a run leave one follow-up run, with the last call's value."""
    return _ran_with(self, tag, value, seconds)


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique=True,
    unique_on=("tag",),
    debounce=1,
    acks_late=True,
)
def debounced_late(self: Any, tag: str, value: Any) -> Any:
    """Debounced, acks_late: its first run works for long (a test kills its worker), the
    runs of its message delivered again at once."""
    first = _events.incr(f"deliveries:{tag}") == 1
    return _ran_with(self, tag, value, 30 if first else 0)


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique=True,
    unique_on=("tag",),
    debounce=1,
    max_retries=1,
)
def debounced_retried(self: Any, tag: str, value: Any) -> Any:
    """Debounced, and retried once by its first run."""
    _ran_with(self, tag, value, 0)
    if self.request.retries == 0:
        raise self.retry(countdown=0.2)
    return value


@app.task(bind=True, base=dedupe.DedupeTask, unique=True, unique_on=("tag",), debounce=1)
def debounced_retried_with(self: Any, tag: str, value: Any) -> Any:
    """Debounced, and retried once by its first run with arguments of its own."""
    _ran_with(self, tag, value, 0)
    if self.request.retries == 0:
        raise self.retry(args=(tag, "own"), countdown=0.2, max_retries=1)
    return value


@app.task(
    bind=True, base=dedupe.DedupeTask, unique=True, unique_on=("tag",), on_duplicate="replace"
)
def replaced_retried_with(self: Any, tag: str, value: Any) -> Any:
    """Replacing, and retried once by its first run with arguments of its own."""
    _ran_with(self, tag, value, 0)
    if self.request.retries == 0:
        raise self.retry(args=(tag, "own"), countdown=0.2, max_retries=1)
    return value


def values_run(tag: str) -> list[tuple[str, str]]:
    """(task id, value) of each run of a ``_ran_with`` task, in start order."""
    return [tuple(raw.decode().split(" ", 1)) for raw in _events.lrange(f"values:{tag}", 0, -1)]  # type: ignore[misc]


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique_on=("tag",),
    key_concurrency=2,
    on_running_countdown=0.2,
    acks_late=True,
)
def two_at_once(self: Any, tag: str, index: int, seconds: float) -> int:
    """At most two runs per tag at once, the other calls in line (acks_late: a run of a
    killed worker is delivered again)."""
    _run(self, tag, seconds)
    return index


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique_on=("tag",),
    key_concurrency=1,
    unique_lease=ENDING_LEASE,
    acks_late=True,
    reject_on_worker_lost=True,
)
def limited_redelivered(self: Any, tag: str) -> int:
    """One run per tag at once (a 30 s slot lease); the child of its first delivery dies
    (SIGKILL) in the run, and Celery puts the message back (reject_on_worker_lost)."""
    delivery = int(_events.incr(f"deliveries:{tag}"))
    _run(self, tag)
    if delivery == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return delivery


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique_on=("tag",),
    key_concurrency=1,
    unique_lease=ENDING_LEASE,
    acks_late=True,
)
def limited_cancelled(self: Any, tag: str) -> int:
    """One run per tag at once (a 30 s slot lease); its first delivery runs for a minute,
    long enough for its worker's cold shutdown to cancel it, and the message comes back."""
    delivery = int(_events.incr(f"deliveries:{tag}"))
    _run(self, tag, 60.0 if delivery == 1 else 0.0)
    return delivery


@app.task(bind=True, base=dedupe.DedupeTask, unique_on=("tag",), key_concurrency=1)
def one_at_once(self: Any, tag: str, index: int, seconds: float) -> int:
    """One run per tag at once, the other calls in line (acked at delivery: a message a
    killed worker prefetched is lost with it)."""
    _run(self, tag, seconds)
    return index


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique=True,
    unique_lease=ENDING_LEASE,
    soft_time_limit=INTERRUPTING_LIMIT,
)
def claimed_when_its_limit_fires(self: Any, tag: str) -> str:
    """A run (of a second) whose claim the test's proxy answers only after the soft time limit
    fired, in ``task_prerun``: the body runs all the same."""
    _run(self, tag, 1.0)
    return tag


@app.task(bind=True, soft_time_limit=INTERRUPTING_LIMIT)
def limited_call_when_its_limit_fires(self: Any, tag: str) -> str:
    """A call of ``one_at_once(tag)`` (task id ``f"{tag}-interrupted"``) whose place in line
    the test's proxy answers only after the soft time limit has interrupted it: with the
    dedup Redis apart from the broker, the place is taken in a round trip of its own, before
    the publish."""
    try:
        one_at_once.apply_async((tag, 0, 0.1), task_id=f"{tag}-interrupted")
    except SoftTimeLimitExceeded:
        return "interrupted"
    return "answered"


@app.task(bind=True, base=dedupe.DedupeTask, unique_on=("tag",), key_concurrency=2)
def two_early_acked(self: Any, tag: str, index: int, seconds: float) -> int:
    """Two runs per tag at once (acked at delivery)."""
    _run(self, tag, seconds)
    return index


def _tenant_limit(tag: str, index: int, seconds: float) -> int:
    return 1 if tag.endswith("-small") else 3


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique_on=("tag",),
    key_concurrency=_tenant_limit,
    on_running_countdown=0.2,
)
def per_tenant(self: Any, tag: str, index: int, seconds: float) -> int:
    """A limit per tag from the call's arguments: 1 for tags ending "-small", else 3."""
    _run(self, tag, seconds)
    return index


@app.task(bind=True, base=dedupe.DedupeTask, unique_on=("tag",), key_rate_limit="2/s")
def two_per_second(self: Any, tag: str, index: int) -> int:
    """At most two starts per tag in any second."""
    _run(self, tag)
    return index


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique_on=("tag",),
    key_concurrency=1,
    key_rate_limit="2/s",
    on_running_countdown=0.2,
)
def one_at_once_two_per_second(self: Any, tag: str, index: int, seconds: float) -> int:
    """One run per tag at a time, at most two starts per tag in any second."""
    _run(self, tag, seconds)
    return index


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique_on=("tag",),
    key_concurrency=1,
    on_running_countdown=0.2,
)
def one_at_a_time(self: Any, tag: str, index: int, seconds: float) -> int:
    """One run per tag at once, the other calls in line."""
    _run(self, tag, seconds)
    return index


@app.task(
    bind=True,
    base=dedupe.DedupeTask,
    unique_on=("tag",),
    key_concurrency=1,
    unique_lease=ENDING_LEASE,
    on_running_countdown=0.2,
)
def one_at_a_time_long_lease(self: Any, tag: str, index: int, seconds: float) -> int:
    """One run per tag at once, its slot held with a 30 s lease."""
    _run(self, tag, seconds)
    return index
