"""A loopback TCP proxy to a Redis whose deliveries of the server's writes a test shapes: the
network between a client and its server, as a fault test needs it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time

from .helpers import ROOT, free_port, wait_for

#: RabbitMQ's port on this machine (a proxy in front of it: ``RedisProxy(RABBITMQ_PORT)``).
RABBITMQ_PORT = 5672


class RedisProxy:
    """Passes bytes both ways; the server's writes go through :meth:`deliver`, which a
    subclass makes late or cut."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def amqp_url(self) -> str:
        """The broker URL through this proxy, when it stands in front of RabbitMQ."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def deliver(self, sink: socket.socket, data: bytes) -> None:
        """Hand one of the server's writes to the client."""
        sink.sendall(data)

    def forward(self, sink: socket.socket, data: bytes, source: socket.socket) -> None:
        """Hand one of the client's writes to the server."""
        sink.sendall(data)

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                server = socket.create_connection(("127.0.0.1", self.target_port))
                self.sockets += [client, server]
                for source, sink, from_server in ((client, server, False), (server, client, True)):
                    threading.Thread(
                        target=self._pipe, args=(source, sink, from_server), daemon=True
                    ).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, from_server: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if from_server:
                    self.deliver(sink, data)
                else:
                    self.forward(sink, data, source)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


class CuttingProxy(RedisProxy):
    """Drops a client's connection, unsent, when it writes a command holding each of
    ``cut_at`` (once; each time with ``every``): the server never sees that command, and the
    client's next read finds the connection closed. With ``delivered``, the server gets that
    write before the cut: its fate is the server's, and the client never hears it."""

    def __init__(self, target_port: int, *, every: bool = False, delivered: bool = False) -> None:
        super().__init__(target_port)
        self.cut_at: tuple[bytes, ...] = ()
        self.cuts = 0
        self.every = every
        self.delivered = delivered

    def forward(self, sink: socket.socket, data: bytes, source: socket.socket) -> None:
        if self.cut_at and all(part in data for part in self.cut_at):
            if not self.every:
                self.cut_at = ()
            self.cuts += 1
            if self.delivered:
                sink.sendall(data)
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            return
        sink.sendall(data)


class HoldingProxy(RedisProxy):
    """Holds the server's reply to the next command holding each of ``hold_at`` (once) for
    ``hold_for`` seconds: Redis ran the command at once, its answer comes late."""

    def __init__(self, target_port: int, hold_for: float) -> None:
        super().__init__(target_port)
        self.hold_for = hold_for
        self.hold_at: tuple[bytes, ...] = ()
        self.held = 0
        self._late: set[socket.socket] = set()

    def forward(self, sink: socket.socket, data: bytes, source: socket.socket) -> None:
        if self.hold_at and all(part in data for part in self.hold_at):
            self.hold_at = ()
            self._late.add(source)
        sink.sendall(data)

    def deliver(self, sink: socket.socket, data: bytes) -> None:
        if sink in self._late:
            self._late.discard(sink)
            self.held += 1
            time.sleep(self.hold_for)
        sink.sendall(data)


class ProxyProcess:
    """``tests.chaos.tcp_proxy`` in a process of its own between clients and ``target_port``:
    stopped, every connection through it is cut and new ones are refused; started again,
    on the same port, the way is open."""

    def __init__(self, target_port: int) -> None:
        self.port, self.target = free_port(), target_port
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.tcp_proxy", str(self.port), str(self.target)],
            cwd=ROOT,
        )
        wait_for(self._listening, message="the proxy process listens")

    def _listening(self) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
