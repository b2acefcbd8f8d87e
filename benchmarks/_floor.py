"""The floor of a guarded run on a solo worker: the Redis I/O a claim and a release cost, with
none of dedupe's Python around it.

Its task's request writes a SET on a raw socket of its own as the worker accepts the message
(where dedupe sends its claim), its task reads the reply before the body (where dedupe reads
the claim's), and writes a DEL as the body ends, its reply read with the next claim's (as
dedupe reads its release's). Two writes and one read per run, as dedupe's, and nothing else:
a worker of this task, against a plain one, is as close to a plain worker as a run that takes
a lock at its start and frees it at its end can come here.
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

from celery import Celery, Task
from celery.worker.request import Request

from dedupe.store.resp import pack_command

__all__ = ["floor_task"]


class _Wire:
    """One socket to Redis and the replies owed on it (each a single line: +OK, :1)."""

    def __init__(self, url: str) -> None:
        address = urlsplit(url)
        self.sock = socket.create_connection((address.hostname or "127.0.0.1", address.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.owed = 0

    def send(self, command: bytes) -> None:
        self.sock.sendall(command)
        self.owed += 1

    def read_owed(self) -> None:
        data = b""
        while data.count(b"\r\n") < self.owed:
            data += self.sock.recv(65536)
        self.owed = 0


def floor_task(app: Celery, url: str, **options: Any) -> Any:
    """A no-op task ``(x: int)`` on ``app`` whose runs take and free a lock on the Redis
    ``url`` as a guarded run's do, in bare writes (see the module's docstring)."""
    wire = _Wire(url)

    class FloorRequest(Request):  # type: ignore[misc]
        def execute_using_pool(self, pool: Any, **kwargs: Any) -> Any:
            wire.send(pack_command(b"SET", b"floor:" + self.id.encode(), b"1", b"PX", b"30000"))
            return super().execute_using_pool(pool, **kwargs)

    class FloorTask(Task):  # type: ignore[misc]
        Request = FloorRequest

        def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
            wire.read_owed()

        def after_return(
            self, status: Any, retval: Any, task_id: str, *args: Any, **kwargs: Any
        ) -> None:
            wire.send(pack_command(b"DEL", b"floor:" + task_id.encode()))

    @app.task(shared=False, base=FloorTask, **options)
    def floor_noop(x: int) -> None: ...

    return floor_noop
