"""The dedup store on a Sentinel-managed master: a real set (a master, a replica, three
sentinels) started by the test, and a failover during calls and during a run."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

import dedupe
from dedupe._redis_server import RedisServer, _free_port, find_redis_server

from .conftest import in_process_worker
from .helpers import require, wait_for

pytestmark = pytest.mark.slow

MASTER = "dedupemaster"


class SentinelSet:
    """A master, its replica and three sentinels watching it, on free ports."""

    def __init__(self, workdir: Path) -> None:
        executable = find_redis_server()
        require(executable is not None, "no redis-server to start a Sentinel set with")
        assert executable is not None
        self.executable = executable
        self.workdir = workdir
        self.servers: list[RedisServer] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self.ports = {"a": _free_port(), "b": _free_port()}
        self.sentinel_ports = [_free_port() for _ in range(3)]

    def start(self) -> None:
        first, second = self.ports["a"], self.ports["b"]
        self.servers = [
            RedisServer(self.executable, first),
            RedisServer(self.executable, second, "--replicaof", "127.0.0.1", str(first)),
        ]
        for server in self.servers:
            server.start()
        wait_for(
            lambda: self.client(second).info("replication").get("master_link_status") == "up",
            timeout=15,
            message="replica in sync",
        )
        for port in self.sentinel_ports:
            conf = self.workdir / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {first} 2\n"
                f"sentinel down-after-milliseconds {MASTER} 1000\n"
                f"sentinel failover-timeout {MASTER} 5000\n"
            )
            self.processes.append(
                subprocess.Popen(
                    [self.executable, str(conf), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        wait_for(self._watching, timeout=20, message="sentinels see the master, replica, peers")

    def _watching(self) -> bool:
        for port in self.sentinel_ports:
            try:
                state: Any = self.client(port).sentinel_master(MASTER)
            except redis.RedisError:
                return False
            if int(state["num-slaves"]) < 1 or int(state["num-other-sentinels"]) < 2:
                return False
        return True

    @staticmethod
    def client(port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2)

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{port}" for port in self.sentinel_ports)

    def master_port(self) -> int:
        _host, port = self.client(self.sentinel_ports[0]).execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER
        )
        return int(port)

    def failover(self) -> int:
        """Promote the replica (SENTINEL FAILOVER); returns the new master's port."""
        old = self.master_port()
        self.client(self.sentinel_ports[0]).execute_command("SENTINEL", "FAILOVER", MASTER)
        wait_for(lambda: self.master_port() != old, timeout=20, message="a new master")
        new = self.master_port()
        wait_for(
            lambda: self.client(new).info("replication")["role"] == "master",
            timeout=10,
            message="the new master takes writes",
        )
        # Until the sentinels demote it, the old master takes writes too (and loses them when
        # it resyncs): Sentinel's own window, bounded by min-replicas-to-write, not by us.
        wait_for(
            lambda: self.client(old).info("replication")["role"] == "slave",
            timeout=20,
            message="the old master demoted",
        )
        return new

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
        for server in self.servers:
            server.close()


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelSet]:
    found = SentinelSet(tmp_path)
    try:
        found.start()
        yield found
    finally:
        found.stop()


@pytest.fixture
def sentinel_app(make_app: Callable[..., Celery], sentinels: SentinelSet) -> Celery:
    return make_app(dedupe_redis_url=sentinels.url, dedupe_redis_options={"master_name": MASTER})


def test_calls_deduplicate_on_the_master_the_sentinels_name(
    sentinel_app: Celery, sentinels: SentinelSet
) -> None:
    @sentinel_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    first = job.delay(1)
    assert job.delay(1).deduplicated
    record = sentinels.client(sentinels.master_port()).get(first.keys.call)
    assert record is not None


def test_asyncio_calls_deduplicate_on_the_master_the_sentinels_name(
    sentinel_app: Celery, sentinels: SentinelSet
) -> None:
    @sentinel_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    async def twice() -> list[dedupe.DedupeResult]:
        return [await job.aapply_async_unique((2,)), await job.aapply_async_unique((2,))]

    first, second = asyncio.run(twice())
    assert (first.deduplicated, second.deduplicated) == (False, True)
    assert sentinels.client(sentinels.master_port()).exists(first.keys.call)


def test_a_url_without_the_master_name_says_how_to_give_it(
    make_app: Callable[..., Celery], sentinels: SentinelSet
) -> None:
    app = make_app(dedupe_redis_url=sentinels.url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    with pytest.raises(dedupe.ConfigurationError, match="master_name"):
        job.delay(1)


def test_a_sentinel_broker_gives_the_store_its_master(
    make_app: Callable[..., Celery], sentinels: SentinelSet
) -> None:
    app = make_app(
        broker=sentinels.url,
        broker_transport_options={"master_name": MASTER},
        dedupe_redis_url=None,
    )
    config = dedupe.runtime.runtime_of(app).config
    assert config.redis_url == sentinels.url
    assert config.redis_options["master_name"] == MASTER


def test_calls_go_on_through_a_failover_and_keep_their_keys(
    sentinel_app: Celery, sentinels: SentinelSet
) -> None:
    @sentinel_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None: ...

    before = [job.delay(x) for x in range(20)]
    wait_for(
        lambda: sentinels.client(sentinels.ports["b"]).dbsize() >= 20,
        message="the replica has the keys",
    )
    errors: list[BaseException] = []
    stop = threading.Event()

    def burst() -> None:
        x = 100
        while not stop.is_set():
            try:
                job.delay(x % 40 + 100)
            except BaseException as exc:  # the policy ("enqueue") must absorb the failover
                errors.append(exc)
            x += 1

    caller = threading.Thread(target=burst)
    caller.start()
    try:
        new_master = sentinels.failover()
        time.sleep(1.0)  # calls on the new master
    finally:
        stop.set()
        caller.join(30)
    assert errors == []
    assert new_master == sentinels.ports["b"]
    # Keys written before the failover were replicated: their calls are still duplicates.
    again = [job.delay(x) for x in range(20)]
    assert all(result.deduplicated for result in again)
    assert [r.id for r in again] == [r.id for r in before]
    assert not job.delay(999).deduplicated  # and new keys are written on the new master
    assert sentinels.client(new_master).exists(job.delay(999).keys.call)


def test_a_runs_key_follows_the_run_through_a_failover_and_is_freed_at_its_end(
    sentinel_app: Celery, sentinels: SentinelSet
) -> None:
    sentinel_app.conf.dedupe_default_lease = 3
    gate = threading.Event()

    @sentinel_app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def job(x: int) -> None:
        gate.wait(30)

    with in_process_worker(sentinel_app):
        result = job.delay(1)
        wait_for(
            lambda: (h := dedupe.lookup(job, (1,))) is not None and h.state == "running",
            message="running",
        )
        new_master = sentinels.failover()
        time.sleep(3.5)  # past one lease: only renewals on the new master keep the key
        holder: Any = dedupe.lookup(job, (1,))
        assert holder is not None
        assert holder.state == "running"
        assert sentinels.client(new_master).exists(result.keys.call)
        gate.set()
        result.get(timeout=10)
        wait_for(lambda: dedupe.lookup(job, (1,)) is None, timeout=5, message="freed")
