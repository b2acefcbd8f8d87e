"""The chaos run: ``python -m tests.chaos [--broker redis|amqp|both] ...`` (or
``./noxw -s chaos -- ...``).

P producer processes make N calls each over K keys of two ``acks_late`` tasks (one
``unique_until="finished"``, one ``"started"``) while two ``celery worker -P prefork -c 2``
subprocesses run them, and the harness injects faults on a fixed timeline: SIGKILLs of a pool
child or of a whole worker (restarted at once), one restart of the dedup Redis (its data lost),
one cut of the broker (a private Redis shut down and started again from its dump; RabbitMQ,
which is shared, through a TCP proxy of the harness that it kills and starts again). Then it
drains, reads the evidence (a Redis of its own, untouched by the faults) and prints one table
(tests/chaos/evidence.py says what each check means). Exit status 1 on any failure.

``CHAOS_MONITOR=<file>`` appends every command the dedup Redis runs (``redis-cli monitor``,
reattached after the restart) to that file: a failed check's key, read from its history.
``CHAOS_BROKER_MONITOR=<file>`` names the file of the Redis broker's commands, which the
harness always logs (by default ``broker-<run>.log`` in the worker logs' directory): the
messages kombu popped and never recorded are read from it (tests/chaos/broker_log.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import random
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import msgpack
import redis
from celery import Celery, signals
from kombu import Connection
from kombu import Queue as KombuQueue

from dedupe import events
from dedupe.demo.server import RedisServer
from dedupe.errors import RecordFormatError
from dedupe.values.keys import LATEST_SUFFIX, RAN_SUFFIX
from dedupe.values.record import Holder, unpack_owner
from tests.helpers import LOGDIR, ProcessGroup, WorkerProcess, free_port, keys_with_prefix

from . import broker_log
from .evidence import (
    ENDED_LEFT,
    PURGEABLE,
    TAKEN,
    UNKNOWN,
    Call,
    Checks,
    Evidence,
    Fault,
    Row,
    _limit_key,
    failed,
    table,
)

AMQP_HOST, AMQP_PORT = "127.0.0.1", 5672
AMQP_URL = f"amqp://guest:guest@{AMQP_HOST}:{AMQP_PORT}//"


@dataclass(frozen=True)
class Params:
    producers: int = 8
    calls: int = 1000
    keys: int = 50
    duration: float = 90.0  # seconds over which each producer spreads its calls
    kills: int = 10
    worker_kills: int = 4  # of the kills, whole workers (the rest pool children)
    lease: float = 10.0
    restart_dedup: bool = True
    #: When the dedup Redis restarts, as a share of ``duration``.
    restart_at: float = 0.27
    cut_broker: bool = True
    cut_seconds: float = 4.0
    visibility_timeout: float = 30.0  # the Redis broker's: when a killed worker's message returns
    stall_seconds: float = 20.0  # a worker consuming nothing this long while its queue has some
    drain: float = 150.0  # at most this long after the producers end
    restart_window: float = 0.0  # 0: twice the lease
    plain: bool = False
    #: Times every client of the dedup Redis is dropped at once (CLIENT KILL TYPE normal, as
    #: Sentinel does to a demoted master's clients; no data lost).
    client_kills: int = 2
    #: Tasks sent whose soft time limit fires in the middle of their dedup calls.
    soft_limits: int = 6
    #: Processes that call the flow-control tasks (one thread per key, each key of one
    #: thread: its calls are sequential and their arguments increase).
    flow_producers: int = 2
    #: Keys of the debounced task (0: no debounced calls), called in bursts.
    debounced_keys: int = 4
    #: Keys of the limited task (key_concurrency), of the rated one (key_rate_limit) and of
    #: the paced one (both).
    limited_keys: int = 2
    rated_keys: int = 2
    paced_keys: int = 2
    #: Calls of the side producer (0: none): a burst to the side queue just before the
    #: purge that empties it, two of three of a unique task, one of three of a task no
    #: worker registers (the worker drops it and frees its key).
    side_calls: int = 30
    #: When the side queue is purged, as a share of ``duration``.
    purge_at: float = 0.7

    @property
    def window(self) -> float:
        return self.restart_window or 2 * self.lease


QUICK = Params(
    producers=4,
    calls=150,
    keys=10,
    duration=20.0,
    kills=4,
    worker_kills=2,
    cut_seconds=3.0,
    visibility_timeout=15.0,
    stall_seconds=15.0,
    drain=60.0,
    # After the first whole-worker kill (7.5 s): that worker's unacked messages wait out the
    # visibility timeout across the restart, whose data loss takes their keys.
    restart_at=0.45,
)


# -- producers (spawned processes) ----------------------------------------------------------


def _produce(seed: int, params: Params, barrier: Any) -> None:
    from tests.chaos import app as chaos_app

    logging.getLogger("dedupe").addHandler(chaos_app.Warnings())
    # The id of the message a call was publishing: a call that raises still names it.
    publishing: list[str] = [""]

    def note(headers: Any = None, **_: Any) -> None:
        publishing[0] = str((headers or {}).get("id", ""))

    signals.before_task_publish.connect(note, weak=False)
    # Whether the call's duplicate answer was remembered (no round trip).
    from_memory = [False]

    def deduplicated(remembered: bool = False, **_: Any) -> None:
        from_memory[0] = remembered

    events.call_deduplicated.connect(deduplicated, weak=False)
    tasks = {"finished": chaos_app.finished, "started": chaos_app.started}
    if params.plain:
        tasks = {"finished": chaos_app.plain_finished, "started": chaos_app.plain_started}
    rng = random.Random(seed)
    pause = params.duration / params.calls
    sink = f"{chaos_app.PREFIX}:calls"
    batch: list[str] = []
    barrier.wait()
    for _ in range(params.calls):
        name, key = rng.choice(list(tasks)), rng.randrange(params.keys)
        start, publishing[0], from_memory[0] = time.time(), "", False
        try:
            result = tasks[name].apply_async((key, 0.05 + (key % 5) * 0.08))
            call = Call(
                name,
                key,
                result.id,
                bool(getattr(result, "deduplicated", False)),
                start,
                time.time(),
                pid=os.getpid(),
                remembered=from_memory[0],
            )
        except Exception as exc:
            error = type(exc).__name__
            call = Call(name, key, publishing[0], False, start, time.time(), error, os.getpid())
        batch.append(call.encode())
        if len(batch) >= 50:
            chaos_app.evidence.rpush(sink, *batch)
            batch.clear()
        time.sleep(rng.uniform(0, 2 * pause))
    if batch:
        chaos_app.evidence.rpush(sink, *batch)


#: How a limited task's key is called: bursts of so many calls (20-100 ms apart) whose runs
#: last so long (seconds), then a pause; each key keeps up over its pauses (its backlog drains
#: within the drain). ``paced`` (one run at once, three starts a second) is called about
#: once a second, and its runs are now shorter than its rate's spacing, now longer.
BURSTS: dict[str, tuple[tuple[int, int], tuple[float, float], tuple[float, float]]] = {
    "limited": ((2, 5), (0.2, 0.5), (0.5, 2.0)),
    "rated": ((2, 6), (0.05, 0.05), (0.8, 2.5)),
    "paced": ((2, 5), (0.05, 0.45), (1.5, 3.5)),
}


class _FlowProducer:
    """A flow producer: one thread per key it owns (key % flow_producers == seed), each
    calling a flow-control task in bursts for ``duration`` seconds. Debounced: its argument
    one more at every call, calls a little apart (under the quiet period: they collapse),
    now and then a burst longer than the cap, and pauses that end a burst or not. Limited,
    rated and paced: bursts beyond the limits (they wait their turn), pauses they keep up
    over; a paced key's runs are now shorter than its rate's spacing (the rate holds them
    back), now longer (its one slot does)."""

    def __init__(self, seed: int, params: Params) -> None:
        from tests.chaos import app as chaos_app

        self.app, self.seed, self.params = chaos_app, seed, params
        logging.getLogger("dedupe").addHandler(chaos_app.Warnings())
        self.local = threading.local()
        signals.before_task_publish.connect(self.note, weak=False)
        self.until = 0.0

    def note(self, headers: Any = None, **_: Any) -> None:
        self.local.publishing = str((headers or {}).get("id", ""))

    def owned(self) -> list[tuple[str, int]]:
        p = self.params
        keys = (("debounced", p.debounced_keys), ("limited", p.limited_keys))
        limits = (("rated", p.rated_keys), ("paced", p.paced_keys))
        return [
            (name, key)
            for name, count in (*keys, *limits)
            for key in range(count)
            if key % p.flow_producers == self.seed
        ]

    def run(self, barrier: Any) -> None:
        threads = [threading.Thread(target=self.calls, args=owned) for owned in self.owned()]
        barrier.wait()
        self.until = time.time() + self.params.duration
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def call(
        self,
        name: str,
        key: int,
        args: tuple[Any, ...],
        arg: int | None = None,
        *,
        by_name: bool = False,
    ) -> str:
        """One call, as the evidence writes it (``by_name``: ``send_task``, whose message
        carries no limit: the worker takes it from the task)."""
        start, self.local.publishing = time.time(), ""
        try:
            task = getattr(self.app, name)
            send = self.app.app.send_task if by_name else None
            result = send(task.name, args) if send else task.apply_async(args)
            deduplicated = bool(getattr(result, "deduplicated", False))
            call = Call(
                name, key, result.id, deduplicated, start, time.time(), pid=os.getpid(), arg=arg
            )
        except Exception as exc:
            error, task_id = type(exc).__name__, self.local.publishing
            call = Call(name, key, task_id, False, start, time.time(), error, os.getpid(), arg=arg)
        return call.encode()

    def calls(self, name: str, key: int) -> None:
        rng = random.Random(f"{self.seed}:{name}:{key}")
        value, made = 0, []
        while time.time() < self.until:
            if name == "debounced":
                for _ in range(rng.choice((1, 2, 3, 4, 6, 12))):
                    value += 1
                    made.append(self.call(name, key, (key, value, 0.05 + 0.05 * key), value))
                    time.sleep(rng.uniform(0.03, 0.25))
                time.sleep(rng.uniform(0.1, 1.5))
                continue
            calls, seconds, pause = BURSTS[name]
            for _ in range(rng.randint(*calls)):
                # (A limited call in four by send_task: issue 41's limit on every path.)
                by_name = name == "limited" and rng.random() < 0.25
                made.append(self.call(name, key, (key, rng.uniform(*seconds)), by_name=by_name))
                time.sleep(rng.uniform(0.02, 0.1))
            time.sleep(rng.uniform(*pause))
        if made:
            self.app.evidence.rpush(f"{self.app.PREFIX}:calls", *made)


def _produce_side(seed: int, params: Params, barrier: Any) -> None:
    """The side producer: a burst of calls a second before the purge (the harness waits
    for it), to the side queue and of a task no worker knows."""
    import dedupe
    from tests.chaos import app as chaos_app

    @chaos_app.app.task(
        name="tests.chaos.unknown", base=dedupe.DedupeTask, unique=True, shared=False
    )
    def unknown(key: int) -> None:
        """Registered here alone: no worker knows it."""

    tasks = {PURGEABLE: chaos_app.purgeable, UNKNOWN: unknown}
    rng = random.Random(seed)
    calls: list[str] = []
    barrier.wait()
    time.sleep(max(0.0, params.purge_at * params.duration - 1.0))
    for index in range(params.side_calls):
        name = UNKNOWN if index % 3 == 2 else PURGEABLE
        key = rng.randrange(params.side_calls)
        start = time.time()
        try:
            # (The purgeable task is routed to the side queue, which no worker consumes; the
            # unknown one goes to the workers' queue, whose worker drops it.)
            args = (key, 0.3) if name == PURGEABLE else (key,)
            result = tasks[name].apply_async(args)
            call = Call(name, key, result.id, bool(result.deduplicated), start, time.time())
        except Exception as exc:
            call = Call(name, key, "", False, start, time.time(), type(exc).__name__)
        calls.append(call.encode())
    if calls:
        chaos_app.evidence.rpush(f"{chaos_app.PREFIX}:side-calls", *calls)


def _produce_flow(seed: int, params: Params, barrier: Any) -> None:
    _FlowProducer(seed, params).run(barrier)


# -- the broker: a private Redis, or RabbitMQ behind a proxy --------------------------------


class Broker:
    """What workers and producers connect to, and how the harness cuts it."""

    url: str
    kind: str

    def start(self) -> None: ...
    def cut(self, seconds: float) -> None: ...
    def close(self) -> None: ...

    def queue_length(self, queue: str) -> int | None:
        raise NotImplementedError

    def snapshot(self, queue: str) -> set[str]:
        """Task ids the transport holds (queued, or popped and unacked); Redis only."""
        return set()


class RedisBroker(Broker):
    kind = "redis"

    def __init__(self) -> None:
        self.server = RedisServer()
        self.url = self.server.url
        self.client = redis.Redis(port=self.server.port, socket_timeout=2)

    def start(self) -> None:
        self.server.start()

    def cut(self, seconds: float) -> None:
        # SHUTDOWN SAVE, then start again from the dump: a restart that keeps the queue.
        with contextlib.suppress(redis.RedisError):
            self.client.shutdown(save=True)
        self.server.stop()
        time.sleep(seconds)
        self.server.start()

    def close(self) -> None:
        self.client.close()
        self.server.close()

    def queue_length(self, queue: str) -> int | None:
        try:
            return int(self.client.llen(queue))
        except redis.RedisError:
            return None

    def snapshot(self, queue: str) -> set[str]:
        messages = list(self.client.lrange(queue, 0, -1))
        messages += [json.loads(raw)[0] for raw in self.client.hvals("unacked")]
        return {_task_id(message) for message in messages}


def _keys_left(client: redis.Redis, key: bytes) -> list[str]:
    """``<key> ttl <s>s held by <task id>`` for a record (the form
    :meth:`Checks.keys_left_rows` reads); ``<key> ttl <s>s latest arguments of <task id>``
    for each field of a latest-arguments hash; ``<key> ttl <s>s ended run of <task id> retries
    <n>`` for each tombstone of a debounced or replacing run (end_latest.lua);
    ``<key> (<type>) ttl <s>s`` for any other."""
    kind = client.type(key).decode()
    if kind == "string":
        return [_key_left(client, key)]
    name, pttl = key.decode(), int(client.pttl(key))
    if kind == "hash" and name.endswith(LATEST_SUFFIX):
        lines = []
        for owner, value in client.hgetall(key).items():
            taken = owner == b"taken"  # (take_latest.lua's last take: {owner, entry})
            if taken:
                owner = msgpack.unpackb(value, raw=True)[0]
            lines.append(
                f"{name} {_ttl(pttl)} latest arguments of {unpack_owner(owner)}"
                + (TAKEN if taken else "")
            )
        return lines
    if kind == "zset" and name.endswith(RAN_SUFFIX):
        ended = [msgpack.unpackb(raw, raw=True) for raw in client.zrange(key, 0, -1)]
        return [
            f"{name} {_ttl(pttl)}{ENDED_LEFT}{unpack_owner(owner)} retries {retries}"
            for owner, retries in ended
        ]
    if kind == "zset":
        # (The limits' sets: evidence.Checks.limits_left_rows reads these lines.)
        seconds, micro = client.time()
        now = seconds * 1000 + micro / 1000
        lines = []
        for raw, score in client.zrange(key, 0, -1, withscores=True):
            member, ahead = raw.decode(), (score - now) / 1000
            if name.endswith(":line"):
                when = f"ticket {score:g}"
            elif name.endswith(":slots"):
                when = "lease over" if ahead <= 0 else f"lease ends in {ahead:.2f}s"
            else:
                when = f"at {ahead:+.2f}s"
            lines.append(f"{name} {_ttl(pttl)} member {member} {when}")
        return lines
    return [f"{name} ({kind}) {_ttl(pttl)}"]


def _ttl(pttl: int) -> str:
    """``ttl <s>s``, or ``ttl none`` for a key that never expires (PTTL -1)."""
    return "ttl none" if pttl == -1 else f"ttl {pttl / 1000:g}s"


def _waits(line: str) -> bool:
    """A line of the keys left that says work is still to come: a record, a place in a
    limited key's line, a slot whose lease runs (a run still on, or a killed run's lease:
    at most ``lease`` seconds), a rated key's start reserved for later."""
    if " latest arguments of " in line or ENDED_LEFT in line:
        return False
    suffix = _limit_key(line)
    if suffix == ":slots":
        return " lease ends in " in line  # (a run still on, or a killed one's lease)
    return not suffix or suffix == ":line" or (suffix == ":plan" and " at +" in line)


def _key_left(client: redis.Redis, key: bytes) -> str:
    """``<key> ttl <s>s held by <task id>`` (the form :meth:`Checks.keys_left_rows` reads)."""
    name, raw, pttl = key.decode(), client.get(key), int(client.pttl(key))
    try:
        holder = Holder.from_raw(name, raw, pttl).task_id if raw is not None else "nothing"
    except RecordFormatError:
        holder = "an unreadable record"
    return f"{name} {_ttl(pttl)} held by {holder}"


def _task_id(message: Any) -> str:
    if isinstance(message, bytes | str):
        message = json.loads(message)
    return str(message["headers"]["id"])


class AmqpBroker(Broker):
    """The shared RabbitMQ, reached through a proxy process: killing it cuts every connection."""

    kind = "amqp"

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        self.proxy = ProcessGroup({}, LOGDIR / f"chaos-proxy-{self.port}.log")

    def start(self) -> None:
        self.proxy.spawn(
            [sys.executable, "-m", "tests.chaos.tcp_proxy", str(self.port), str(AMQP_PORT)]
        )
        self.proxy.wait_ready(self._listening, "the RabbitMQ proxy")

    def _listening(self) -> bool:
        import socket

        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def cut(self, seconds: float) -> None:
        self.proxy.stop(timeout=2)
        time.sleep(seconds)
        self.start()

    def close(self) -> None:
        self.proxy.stop(timeout=2)

    def queue_length(self, queue: str) -> int | None:
        # A connection of each call's own: the stall watch's thread and the drain both ask,
        # and two threads on one py-amqp connection can each wait for the frame the other
        # read (a drain that hung for good on RabbitMQ, once, with an empty queue).
        try:
            with Connection(AMQP_URL, connect_timeout=2) as fresh:
                _, count, _ = fresh.default_channel.queue_declare(queue, passive=True)
                return int(count)
        except Exception:
            return None

    def delete(self, queue: str) -> None:
        with contextlib.suppress(Exception), Connection(AMQP_URL, connect_timeout=2) as fresh:
            fresh.default_channel.queue_delete(queue)


# -- the run ---------------------------------------------------------------------------------


class _Worker(WorkerProcess):
    """Ready when its log says so: no remote control from the harness, whose broker
    connections a cut may have closed (and no app.control in a process that forks)."""

    def start(self) -> None:
        self.spawn(self.command)
        self.wait_ready(lambda: " ready." in self.tail(20_000), "worker", timeout=60)


class Fleet:
    """Two workers; kills, restarts, and the watch for a worker that stopped consuming."""

    def __init__(self, env: dict[str, str], evidence: redis.Redis, prefix: str) -> None:
        self.env, self.evidence, self.prefix = env, evidence, prefix
        self.lock = threading.RLock()
        self.workers: list[WorkerProcess] = []
        self.started_at: dict[int, float] = {}
        self.logs: list[Path] = []
        self.killed: dict[int, float] = {}

    def new_worker(self) -> WorkerProcess:
        # (Not the side queue: its messages wait there for the purge.)
        queue = ("-Q", self.env["CHAOS_QUEUE"])
        worker = _Worker(None, self.env, concurrency=2, module="tests.chaos.app", extra=queue)
        try:
            worker.start()
        except BaseException:
            worker.stop(timeout=2)
            raise
        assert worker.process is not None
        self.started_at[worker.process.pid] = time.time()
        self.logs.append(worker.log)
        return worker

    def start(self, count: int = 2) -> None:
        self.workers = [self.new_worker() for _ in range(count)]

    def kill_child(self, index: int) -> str:
        with self.lock:
            worker = self.workers[index]
            children = worker.child_pids()
            if not children:
                return "no child"
            pid = random.Random(len(self.killed)).choice(children)
            self.killed[pid] = time.time()
            os.kill(pid, signal.SIGKILL)
            return f"child {pid} of worker {index}"

    def kill_worker(self, index: int, between: Callable[[], None] | None = None) -> str:
        """SIGKILL the worker's process group, run ``between``, start a new worker."""
        with self.lock:
            worker = self.workers[index]
            assert worker.process is not None
            pids = [worker.process.pid, *worker.child_pids()]
            now = time.time()
            self.killed.update(dict.fromkeys(pids, now))
            os.killpg(worker.process.pid, signal.SIGKILL)
            worker.process.wait()
            worker.process = None
            if between is not None:
                between()
            self.workers[index] = self.new_worker()
            return f"worker {index} (pids {' '.join(map(str, pids))})"

    def idle_for(self, index: int) -> float:
        """Seconds since this worker last received a message (or started)."""
        worker = self.workers[index]
        if worker.process is None:
            return 0.0
        pid = worker.process.pid
        consumed = self.evidence.hget(f"{self.prefix}:consumed", pid)
        last = max(float(consumed or 0), self.started_at.get(pid, 0.0))
        return time.time() - last

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop(timeout=30)


@dataclass
class Outcome:
    broker: str
    rows: list[Row]
    seconds: float
    text: str

    @property
    def failed(self) -> bool:
        return failed(self.rows)


class Scenario:
    def __init__(self, params: Params, broker: Broker) -> None:
        self.params = params
        self.broker = broker
        self.run_id = f"chaos{uuid.uuid4().hex[:8]}"
        self.queue = f"{self.run_id}-q"
        self.faults: list[Fault] = []
        self.cuts: list[tuple[float, float]] = []
        self.stop_watch = threading.Event()
        #: The Redis broker's command log (None on RabbitMQ, or before the run), and what
        #: stops it.
        self.broker_log: Path | None = None
        self._stop_broker_log: Callable[[], None] = lambda: None

    def timeline(self) -> list[tuple[float, str, int]]:
        """(seconds into the run, fault, worker index): kills spread evenly, whole-worker kills
        among them spread too; the dedup restart and the broker cut between kills."""
        p = self.params
        events = []
        every = p.kills // p.worker_kills if p.worker_kills else 0
        for i in range(p.kills):
            whole = bool(every) and i % every == every // 2 and i // every < p.worker_kills
            events.append(
                (
                    (i + 0.5) * p.duration / max(p.kills, 1),
                    "worker kill" if whole else "child kill",
                    (i // 2) % 2,
                )
            )
        if p.restart_dedup:
            events.append((p.restart_at * p.duration, "dedup restart", 0))
        if p.cut_broker:
            events.append((0.6 * p.duration, "broker cut", 0))
        for i in range(p.client_kills):
            events.append(
                ((0.4 + 0.4 * i / max(p.client_kills, 1)) * p.duration, "clients killed", 0)
            )
        if p.side_calls and not p.plain:
            events.append((p.purge_at * p.duration, "purge", 0))
        if not p.plain:
            for i in range(p.soft_limits):
                events.append(((i + 0.3) * p.duration / p.soft_limits, "soft limit", i))
        return sorted(events)

    def inject(self, kind: str, index: int) -> None:
        start = time.time()
        vanished: frozenset[str] = frozenset()
        if kind == "purge":
            # (After the side producer's burst, however late its process came to it.)
            side = f"{self.run_id}:side-calls"
            deadline = time.monotonic() + 20
            while not self.fleet.evidence.exists(side) and time.monotonic() < deadline:
                time.sleep(0.1)
            purged = self._purge_side()
            detail = f"{len(purged)} messages taken off the side queue"
            self.faults.append(Fault(kind, start, time.time(), detail, purged=purged))
            return
        if kind == "child kill":
            detail = self.fleet.kill_child(index)
        elif kind == "worker kill":
            before = self._snapshot()
            found: list[set[str]] = []
            detail = self.fleet.kill_worker(index, lambda: found.append(self._snapshot()))
            vanished = frozenset(before - found[0]) if self.broker.kind == "redis" else vanished
        elif kind == "dedup restart":
            self.dedup.stop()
            self.dedup.start()
            detail = f"port {self.dedup.port}, data lost"
        elif kind == "clients killed":
            client = redis.Redis(port=self.dedup.port, socket_timeout=2)
            try:
                killed = client.client_kill_filter(_type="normal", skipme=True)
            finally:
                client.close()
            detail = f"{killed} clients of the dedup Redis dropped"
        elif kind == "soft limit":
            # (An app of its own: tests.chaos.app is configured for one broker at import.)
            sender = Celery("chaos-harness", broker=self.broker.url, set_as_current=False)
            try:
                sender.send_task(
                    "tests.chaos.app.interrupted", (index, self.params.keys), queue=self.queue
                )
            finally:
                sender.close()
            detail = "a task whose soft time limit interrupts its dedup calls"
        else:
            with self.fleet.lock:
                before = self._snapshot()
                self.broker.cut(self.params.cut_seconds)
                after = self._snapshot()
            # A worker's BRPOP that took a message as the server shut down, and whose reply or
            # unacked write the shutdown cut off, lost it: kombu's window, as at a kill.
            vanished = frozenset(before - after) if self.broker.kind == "redis" else vanished
            self.cuts.append((start, time.time()))
            detail = f"{self.broker.kind} down {self.params.cut_seconds:g}s"
        self.faults.append(Fault(kind, start, time.time(), detail, vanished))

    def _purge_side(self) -> frozenset[str]:
        """Take every message off the side queue, none acked back (a purge, read): nothing
        of the library sees it; the workers' reaper frees the keys."""
        ids: set[str] = set()
        with Connection(self.broker.url, connect_timeout=5) as connection:
            queue = KombuQueue(f"{self.queue}-side").bind(connection.default_channel)
            while (message := queue.get(no_ack=True)) is not None:
                ids.add(str(message.headers.get("id", "")))
        return frozenset(ids)

    def _snapshot(self) -> set[str]:
        try:
            return self.broker.snapshot(self.queue)
        except redis.RedisError:
            return set()

    def watch(self) -> None:
        """Restart a worker that consumes nothing while its queue has messages."""
        while not self.stop_watch.wait(1.0):
            length = self.broker.queue_length(self.queue)
            if not length:
                continue
            with self.fleet.lock:
                for index in range(len(self.fleet.workers)):
                    self._check_stall(index, length)

    def _check_stall(self, index: int, length: int) -> None:
        idle = self.fleet.idle_for(index)
        since_cut = min((time.time() - end for _, end in self.cuts), default=idle)
        if idle < self.params.stall_seconds or since_cut < self.params.stall_seconds:
            return
        worker = self.fleet.workers[index]
        assert worker.process is not None
        born = self.fleet.started_at[worker.process.pid]
        cut_while_alive = any(start > born for start, _ in self.cuts)
        # billiard logs an ack that raised in the main process's result callback.
        failed_ack = "Pool callback raised exception" in worker.tail()
        why = (
            f"kombu: acks failed during the broker cut (a failed ack in its log: {failed_ack})"
            if cut_while_alive and self.broker.kind == "redis"
            else "no broker cut explains it"
        )
        start = time.time()
        detail = self.fleet.kill_worker(index)
        self.faults.append(
            Fault(
                "stall",
                start,
                time.time(),
                f"{why}; {detail} idle {idle:.0f}s with {length} queued; log {worker.log}",
            )
        )

    def drained(self) -> bool:
        if self.broker.queue_length(self.queue) != 0:
            return False
        if self.broker.kind == "redis" and self._snapshot():
            return False
        # (A latest-arguments field of a task id that will never take it lives out its
        # ttl, as it should; so do the limits' logs: the drain waits for records, places in
        # a line and reserved starts to come; the checks judge the rest.)
        waiting = [line for line in self._keys_left() if _waits(line)]
        if not waiting or self.broker_log is None:
            return not waiting
        # A key that names a message kombu popped and lost waits for nothing that will come
        # (the checks judge it): the drain does not wait out its ttl for it.
        return broker_log.only_lost(waiting, self._lost())

    def _keys_left(self) -> list[str]:
        """The dedup keys of the run, each with its time to live and the task id it names."""
        client = redis.Redis(port=self.dedup.port, socket_timeout=2)
        try:
            return [
                line
                for key in keys_with_prefix(client, self.run_id)
                for line in _keys_left(client, key)
            ]
        finally:
            client.close()

    def env(self) -> dict[str, str]:
        return {
            "CHAOS_BROKER": self.broker.url,
            "CHAOS_DEDUP": self.dedup.url,
            "CHAOS_EVIDENCE": self.evidence_server.url,
            "CHAOS_QUEUE": self.queue,
            "CHAOS_PREFIX": self.run_id,
            "CHAOS_LEASE": str(self.params.lease),
            "CHAOS_VISIBILITY": str(self.params.visibility_timeout),
        }

    def run(self) -> Outcome:
        began = time.time()
        with contextlib.ExitStack() as stack:
            self.evidence_server = stack.enter_context(RedisServer())
            self.dedup = stack.enter_context(RedisServer())
            if os.environ.get("CHAOS_MONITOR"):
                broker_log.monitor(self.dedup.port, Path(os.environ["CHAOS_MONITOR"]), stack)
            self.broker.start()
            stack.callback(self.broker.close)
            self._log_broker(stack)
            env = self.env()
            os.environ.update(env)  # the spawned producers read it
            if isinstance(self.broker, AmqpBroker):
                stack.callback(self.broker.delete, self.queue)
                stack.callback(self.broker.delete, f"{self.queue}-side")
            evidence = redis.Redis.from_url(self.evidence_server.url)
            self.fleet = Fleet(env, evidence, self.run_id)
            stack.callback(self.fleet.stop)
            self.fleet.start()
            t0 = self._produce_under_faults()
            drain_began = time.time()
            self._drain()
            keys_left = self._keys_left()
            drained = time.time() - drain_began
            self.fleet.stop()
            held = self._snapshot()
            found = Evidence.read(
                evidence, self.run_id, self._with_pops(held), keys_left, self.fleet.killed, t0
            )
            found.held = held
        rows = Checks(found, self.params.window, self.broker.kind).rows()
        seconds = time.time() - began
        mode = "plain Celery tasks" if self.params.plain else "DedupeTask"
        title = (
            f"chaos on {self.broker.kind} ({mode}): {self.params.producers} producers x "
            f"{self.params.calls} calls, {self.params.keys} keys, {seconds:.0f}s "
            f"(drain {drained:.0f}s); "
            f"worker logs in {LOGDIR}"
        )
        return Outcome(self.broker.kind, rows, seconds, table(title, rows))

    def _log_broker(self, stack: contextlib.ExitStack) -> None:
        """Log the Redis broker's commands (``CHAOS_BROKER_MONITOR`` names the file) for the
        messages kombu popped and never recorded (:mod:`.broker_log`); nothing on RabbitMQ."""
        if not isinstance(self.broker, RedisBroker):
            return
        named = os.environ.get("CHAOS_BROKER_MONITOR")
        self.broker_log = Path(named) if named else LOGDIR / f"broker-{self.run_id}.log"
        self._stop_broker_log = broker_log.monitor(self.broker.server.port, self.broker_log, stack)

    def _lost(self) -> list[broker_log.Unrecorded]:
        """The messages the broker's log shows popped and never recorded, so far."""
        assert self.broker_log is not None
        return broker_log.unrecorded(broker_log.read(self.broker_log), self.queue)

    def _with_pops(self, held: set[str]) -> list[Fault]:
        """The faults, each with the messages kombu popped at it and never recorded as
        unacked (:func:`.broker_log.popped_at`); the broker's log is stopped first."""
        if self.broker_log is None:
            return self.faults
        self._stop_broker_log()
        return broker_log.popped_at(self.faults, self._lost(), held)

    def _produce_under_faults(self) -> float:
        context = multiprocessing.get_context("spawn")
        p = self.params
        flow_keys = p.debounced_keys + p.limited_keys + p.rated_keys + p.paced_keys
        flow = p.flow_producers if flow_keys and not p.plain else 0
        side = 1 if p.side_calls and not p.plain else 0
        barrier = context.Barrier(p.producers + flow + side + 1)
        producers = (
            [
                context.Process(target=_produce, args=(seed, p, barrier))
                for seed in range(p.producers)
            ]
            + [
                context.Process(target=_produce_flow, args=(seed, p, barrier))
                for seed in range(flow)
            ]
            + [context.Process(target=_produce_side, args=(7, p, barrier)) for _ in range(side)]
        )
        for process in producers:
            process.start()
        barrier.wait(timeout=120)
        t0 = time.time()
        watcher = threading.Thread(target=self.watch, daemon=True)
        watcher.start()
        try:
            for at, kind, index in self.timeline():
                time.sleep(max(0.0, t0 + at - time.time()))
                self.inject(kind, index)
            for process in producers:
                process.join(max(10.0, t0 + 3 * self.params.duration + 60 - time.time()))
                if process.exitcode != 0:
                    raise RuntimeError(f"a producer failed (exit code {process.exitcode})")
        finally:
            for process in producers:
                if process.is_alive():
                    process.kill()
        return t0

    def _drain(self) -> None:
        deadline = time.monotonic() + self.params.drain
        try:
            while time.monotonic() < deadline and not self.drained():
                time.sleep(1.0)
        finally:
            self.stop_watch.set()


def _brokers(choice: str) -> Iterator[Broker]:
    if choice in ("redis", "both"):
        yield RedisBroker()
    if choice in ("amqp", "both"):
        yield AmqpBroker()


def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Params]:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--broker", choices=("redis", "amqp", "both"), default="both")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the test suite's short form (its values, then any flag given)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the rows here")
    defaults = Params()
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            parser.add_argument(flag, type=type(value), default=None, metavar="N")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else defaults
    given = {
        name: getattr(args, name) for name in asdict(defaults) if getattr(args, name) is not None
    }
    return args, replace(base, **given)


def main(argv: Sequence[str] | None = None) -> int:
    args, params = parse(argv)
    print(f"chaos: {params}", flush=True)
    outcomes = []
    for broker in _brokers(args.broker):
        outcome = Scenario(params, broker).run()
        print(outcome.text + "\n", flush=True)
        outcomes.append(outcome)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    o.broker: {"seconds": o.seconds, "rows": [asdict(row) for row in o.rows]}
                    for o in outcomes
                },
                indent=1,
            )
        )
    return 1 if any(outcome.failed for outcome in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
