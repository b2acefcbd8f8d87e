"""Test helpers: servers, real worker processes, waiting."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.app.task import Task
from celery.backends.redis import ResultConsumer
from kombu import Exchange, Queue

from dedupe.values.keys import (
    RAN_SUFFIX,
    alive_key,
    holds_keys,
    limited_names_key,
    nodes_key,
    reaper_keys,
    watch_keys,
)

# Celery 5.7 requeues a timed-out acks_late message (acks_on_timeout off) and can retry a run
# lost with its child (retry_on_worker_lost); before, such a message is gone.
CELERY_REQUEUES_TIMEOUTS = hasattr(Task, "acks_on_timeout")
CELERY_RETRIES_LOST_RUNS = hasattr(Task, "retry_on_worker_lost")
# Before Celery 5.7 a result's __del__ unsubscribes at once (5.7 never blocks there).
OLD_RESULT_CONSUMER = not hasattr(ResultConsumer, "_flush_pending_unsubscribe")

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
LOGDIR = Path(os.environ.get("DEDUPE_TEST_LOGDIR", "/tmp"))

#: A broker that refuses connections (nothing listens on port 1), and the settings that make
#: every publish to it fail at once: ``make_app(broker=UNREACHABLE, **FAILS_AT_ONCE)``.
UNREACHABLE = "redis://127.0.0.1:1/0"
FAILS_AT_ONCE = {
    "task_publish_retry": False,
    "broker_connection_timeout": 0.5,
    "broker_connection_max_retries": 0,
}


class Clock:
    """The clock of an entry's schedule, moved by the test (``at``: where it starts)."""

    def __init__(
        self, at: dt.datetime = dt.datetime(2026, 11, 24, 9, 0, 0, 500_000, tzinfo=dt.timezone.utc)
    ) -> None:
        self.at = at

    def __call__(self) -> dt.datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += dt.timedelta(seconds=seconds)


#: ``make_app`` settings under which a publish on RabbitMQ whose confirm never comes back
#: raises at once: publisher confirms on, no retry.
CONFIRMED_ONCE = {
    "broker_transport_options": {"confirm_publish": True},
    "task_publish_retry": False,
}

#: The start of an AMQP Basic.Publish method frame's payload (class 60, method 40): what a
#: proxy in front of RabbitMQ finds in a publish.
BASIC_PUBLISH = b"\x00<\x00("


def full_queue(rabbitmq_url: str) -> dict[str, Any]:
    """``make_app`` settings of an app on RabbitMQ whose queue (its own) holds one message and
    refuses the next: under publisher confirms, that publish is answered with a Nack and
    raises (no retry)."""
    queue = f"full-{uuid.uuid4().hex[:8]}"
    arguments = {"x-max-length": 1, "x-overflow": "reject-publish"}
    return {
        "broker": rabbitmq_url,
        **CONFIRMED_ONCE,
        "task_default_queue": queue,
        "task_queues": [Queue(queue, Exchange(queue), queue, queue_arguments=arguments)],
    }


def require(condition: bool, reason: str) -> None:
    """Skip when a server the test needs is missing; under CI=true, fail instead."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing server is a failure)")
    pytest.skip(reason)


def run_script(source: str, *argv: str, timeout: float = 120) -> Any:
    """Run ``source`` (dedented) in a Python process of its own, with this checkout's package
    and ``argv``: the JSON its last line of output prints. For what cannot be undone in the
    test process (a tool that patches Celery for good, monkey-patching, a library broken on
    purpose)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source), *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    interval: float = 0.02,
    message: str = "condition",
) -> Any:
    """Poll until ``predicate()`` is truthy; return its value or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def keys_with_prefix(client: redis.Redis, prefix: str) -> list[bytes]:
    """The keys of calls, runs and beat ticks under ``prefix`` (not the markers, which live
    as long as the server's data: the server's (dedupe.recovery.unacked) and each worker's watch's
    (dedupe.recovery.held); nor the reaper's lock, the workers' holds and node names)."""
    marker = alive_key(prefix).encode()
    watch = watch_keys(prefix, "")[1].encode()
    # The reaper's lock and what the workers hold: with a ttl, the machinery's own.
    reaper = reaper_keys(prefix)[0].encode()
    holds = holds_keys(prefix, "")[0].encode()
    nodes = nodes_key(prefix).encode()
    limited = limited_names_key(prefix).encode()  # (the workers' limited task names)
    return sorted(
        key
        for key in client.scan_iter(match=f"{prefix}:*", count=1000)
        if key not in (marker, limited)
        and not key.startswith((watch, reaper, holds, nodes))
        and not _tombstones(client, key)
    )


def _tombstones(client: redis.Redis, key: bytes) -> bool:
    # The ended runs of a debounced or replacing key live their messages' redelivery horizon
    # by design (an hour with the defaults): with a ttl they are no leak; without one they are.
    return key.endswith(RAN_SUFFIX.encode()) and client.pttl(key) > 0


@contextlib.contextmanager
def app_with_a_store_of_its_own(
    worker_app: Any, broker: str, queue: str, store: Any, **conf: Any
) -> Iterator[Any]:
    """An app of tests.worker_app's tasks on ``broker`` whose dedup store is ``store`` (a
    Redis of the test's own, to restart: ``app.store_server``); none of its keys may be
    left at the end."""
    from celery import Celery

    import dedupe

    app = Celery("worker_app", broker=broker, backend=worker_app.REDIS, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        dedupe_redis_url=store.url,
        dedupe_key_prefix=worker_app.PREFIX,
        dedupe_default_lease=conf.pop("dedupe_default_lease", worker_app.LEASE),
        broker_connection_retry_on_startup=True,
        **conf,
    )
    app.store_server = store
    dedupe.install(app)
    try:
        yield app
        client = redis.Redis.from_url(store.url)
        try:
            fail_on_keys_left(client, worker_app.PREFIX, within=3 * worker_app.LEASE + 3)
        finally:
            client.close()
    finally:
        app.close()


def producer_stub(producer: Any, worker_task: Any, **options: Any) -> Any:
    """``worker_task`` (of tests.worker_app) declared on ``producer`` under its own name and
    signature, a unique DedupeTask with ``options``: what a producer needs to call it (the
    worker runs its own body)."""
    import dedupe

    declare = producer.task(
        name=worker_task.name,
        bind=True,
        base=dedupe.DedupeTask,
        unique=True,
        shared=False,
        **options,
    )
    return declare(worker_task.run.__func__)


def limited_stub(producer: Any, worker_app: Any) -> Any:
    """worker_app's ``one_at_once`` (``key_concurrency=1`` per tag), as ``producer`` calls it."""
    import dedupe

    declare = producer.task(
        name=worker_app.one_at_once.name,
        bind=True,
        base=dedupe.DedupeTask,
        unique_on=("tag",),
        key_concurrency=1,
        shared=False,
    )
    return declare(worker_app.one_at_once.run.__func__)


def fail_on_keys_left(
    client: redis.Redis, prefix: str, within: float, *, shared: bool = False
) -> None:
    """Wait up to ``within`` seconds for the keys of ``prefix`` to go; fail (and delete
    them, for the next test) if any is left. ``shared``: a prefix the shared workers' tests
    use side by side, where a ``key_concurrency`` line's ``:started`` marks (the later copies
    of a call handed a slot twice are dropped for ``unique_ttl``, by design) may be another
    file's test's."""

    def left_now() -> list[bytes]:
        keys = keys_with_prefix(client, prefix)
        return [key for key in keys if not key.endswith(b":started")] if shared else keys

    deadline = time.monotonic() + within
    while (left := left_now()) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        client.delete(*left)
        pytest.fail(f"keys left behind: {left}")


class Lines(logging.Handler):
    """The lines one logger logs at ``level`` or above during the block, held on the logger
    itself (with that level set meanwhile): an in-process worker sets up Celery's logging,
    which takes the root logger's handlers (pytest's caplog) away and sets it to ERROR."""

    def __init__(self, name: str, level: int = logging.DEBUG) -> None:
        super().__init__(level)
        self.logger = logging.getLogger(name)
        self.lines: list[str] = []
        #: The thread that logged each line.
        self.threads: list[int | None] = []
        self._restore = logging.NOTSET

    @property
    def text(self) -> str:
        return "".join(line + "\n" for line in self.lines)

    def text_of(self, thread: int | None) -> str:
        """The lines one thread logged (others may log meanwhile: threads other tests left)."""
        return "".join(
            line + "\n" for line, of in zip(self.lines, self.threads, strict=True) if of == thread
        )

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self.threads.append(record.thread)

    def __enter__(self) -> Lines:
        self._restore = self.logger.level
        self.logger.addHandler(self)
        self.logger.setLevel(self.level)
        return self

    def __exit__(self, *_: Any) -> None:
        self.logger.setLevel(self._restore)
        self.logger.removeHandler(self)


def rabbitmq_available(url: str = "amqp://guest:guest@127.0.0.1:5672//") -> bool:
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=1) as connection:
            connection.ensure_connection(max_retries=1)
        return True
    except Exception:
        return False


def _pythonpath(env: dict[str, str]) -> str:
    """The repository root, after any path the test gives."""
    return os.pathsep.join(path for path in (env.get("PYTHONPATH"), str(ROOT)) if path)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ProcessGroup:
    """A real process started in its own process group, its output in a log file."""

    def __init__(self, env: dict[str, str], log: Path, cwd: Path = ROOT) -> None:
        self.env = {**os.environ, **env, "PYTHONPATH": _pythonpath(env)}
        self.log = log
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(self, command: list[str]) -> subprocess.Popen[bytes]:
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self.process

    def wait_ready(self, ready: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        """Poll ``ready()`` until true; fail with the log if the process exits or stalls."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while not ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"{what} exited at start:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start:\n{self.tail()}")
            time.sleep(0.1)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the group, SIGKILL what is left (children included)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.process = None

    def tail(self, size: int = 200_000) -> str:
        return self.log.read_text(errors="replace")[-size:] if self.log.exists() else ""


class ServerProcess(ProcessGroup):
    """A real HTTP server (uvicorn, gunicorn) on a free port."""

    def __init__(self, command: list[str], env: dict[str, str], cwd: Path = ROOT) -> None:
        self.port = free_port()
        super().__init__(env, LOGDIR / f"server-{self.port}.log", cwd)
        self.command = [part.replace("{port}", str(self.port)) for part in command]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_path: str) -> None:
        import httpx

        def answers() -> bool:
            try:
                httpx.get(self.url + ready_path, timeout=1.0)
            except httpx.HTTPError:
                return False
            return True

        self.spawn(self.command)
        self.wait_ready(answers, "server")


class WorkerProcess(ProcessGroup):
    """A real ``celery worker`` with the prefork pool, ready when it answers a ping."""

    def __init__(
        self,
        app: Any,
        env: dict[str, str],
        concurrency: int = 2,
        module: str = "tests.worker_app",
        extra: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.name = f"w{uuid.uuid4().hex[:8]}@%h"
        super().__init__(env, LOGDIR / f"{self.name[:9]}.log")
        self.command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            module,
            "worker",
            "-P",
            "prefork",
            "-c",
            str(concurrency),
            "-n",
            self.name,
            "--without-mingle",
            "--without-gossip",
            "--loglevel",
            "INFO",
            *extra,
        ]

    @property
    def hostname(self) -> str:
        return self.name.replace("%h", os.uname().nodename)

    def start(self) -> None:
        self.spawn(self.command)
        self.wait_ready(
            lambda: bool(self.app.control.ping(destination=[self.hostname], timeout=0.5)),
            "worker",
        )

    def child_pids(self) -> list[int]:
        assert self.process is not None
        path = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(pid) for pid in path.read_text().split()]


class BeatProcess(ProcessGroup):
    """A real ``celery beat`` with a given scheduler, ready when it says it started."""

    def __init__(
        self, scheduler: str, env: dict[str, str], workdir: Path, module: str = "tests.beat_app"
    ) -> None:
        super().__init__(env, workdir / f"beat-{uuid.uuid4().hex[:6]}.log")
        self.command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            module,
            "beat",
            "-S",
            scheduler,
            "-s",
            str(workdir / f"schedule-{uuid.uuid4().hex[:6]}"),
            "--loglevel",
            "INFO",
            "--max-interval",
            "1",
        ]

    def start(self) -> None:
        self.spawn(self.command)
        self.wait_ready(lambda: "beat: Starting..." in self.tail(), "beat")


def worker_conf(
    queue: str, redis_url: str, prefix: str, lease: float, **more: Any
) -> dict[str, Any]:
    """The settings of an app that real worker subprocesses run (tests/worker_app.py,
    tests/chaos/app.py): its queue, its dedup store and prefix, one message at a time."""
    return {
        "task_default_queue": queue,
        "dedupe_redis_url": redis_url,
        "dedupe_key_prefix": prefix,
        "dedupe_default_lease": lease,
        "broker_connection_retry_on_startup": True,
        "worker_prefetch_multiplier": 1,
        "worker_hijack_root_logger": False,
        **more,
    }


class RunLog:
    """Tasks write when each run starts and ends; tests check that runs never overlap."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.name = f"runlog:{name}"

    def started(self, task_id: str) -> None:
        self.client.rpush(self.name, f"start {task_id} {time.time()!r} {os.getpid()}")

    def ended(self, task_id: str) -> None:
        self.client.rpush(self.name, f"end {task_id} {time.time()!r} {os.getpid()}")

    def runs(self, killed: dict[int, float] | None = None) -> list[tuple[str, float, float | None]]:
        """(task id, start, end or None) for every run, in start order.

        ``killed`` maps the pids of killed processes to when they were killed: a run they
        never ended ends then.
        """
        open_runs: dict[tuple[str, int], list[float]] = {}
        done: list[tuple[str, float, float | None]] = []
        for raw in self.client.lrange(self.name, 0, -1):
            kind, task_id, at, pid = raw.decode().split()
            if kind == "start":
                open_runs.setdefault((task_id, int(pid)), []).append(float(at))
            else:
                done.append((task_id, open_runs[(task_id, int(pid))].pop(0), float(at)))
        for (task_id, pid), starts in open_runs.items():
            end = (killed or {}).get(pid)
            done.extend((task_id, start, end) for start in starts)
        return sorted(done, key=lambda run: run[1])

    def overlaps(self, killed: dict[int, float] | None = None) -> list[tuple[Any, Any]]:
        """Pairs of runs that were live at the same time."""
        runs = self.runs(killed)
        found = []
        for index, (task_id, start, end) in enumerate(runs):
            for other in runs[index + 1 :]:
                if end is None or other[1] < end:
                    found.append(((task_id, start, end), other))
        return found


def exit_code_of_child(pid: int, timeout: float = 10.0) -> int | None:
    """The exit code of a forked child, waited for up to ``timeout`` seconds; None if it
    hung (then it is killed, not left behind)."""
    deadline = time.monotonic() + timeout
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.05)
    return os.waitstatus_to_exitcode(done[1])
