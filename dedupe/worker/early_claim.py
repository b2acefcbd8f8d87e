"""A run's claim, and the claim sent as the worker accepts its message, read as the run starts.

In a pool that runs a task in the process and thread that accepted it (solo, threads),
Celery's own work comes between the two (its bookkeeping, the task-started event, the ack
where it is not deferred, the trace's set-up): a claim sent at the first has its round trip
overlap that work instead of following it. A prefork worker accepts in
the main process for a child, and a green pool for a greenlet: those runs claim as they
start (their own connection, pid and heartbeat).

A claim sent whose run never reads it (Celery failed between the two) holds the key as a
killed run's would: until its lease is over, or, for an unacked message, until the broker
delivers it again.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from dedupe.errors import RedisUnavailable
from dedupe.runs.run import RunSpec, new_token
from dedupe.store.script_runner import Reply
from dedupe.values.record import HOST
from dedupe.values.timing import milliseconds

__all__ = ["Claim", "keep", "take"]


@dataclass(slots=True)
class Claim:
    """What a run's claim writes; ``slot``: the reply of one sent already (None: not sent
    yet, or its send failed). Set by one thread: the one that sends it, then reads it as
    the run starts, with the run's spec (a canvas member's)."""

    task_id: str
    spec: RunSpec
    accepted: bool
    token: str
    lease_ms: int
    record_ttl_ms: int
    pid: int
    now: float
    slot: Reply | None = None
    #: Why it could not be sent (Redis unreachable, under the Retry policy): the run's
    #: claim has failed, and says so as the run starts (it would only fail again).
    error: RedisUnavailable | None = None

    @classmethod
    def of(
        cls,
        task_id: str,
        spec: RunSpec,
        accepted: bool,
        record_ttl_ms: int,
    ) -> Claim:
        lease_ms = milliseconds(spec.lease)
        pid, now = os.getpid(), time.time()
        return cls(task_id, spec, accepted, new_token(), lease_ms, record_ttl_ms, pid, now)

    def arguments(self) -> tuple[str, int, str, int, int]:
        """:meth:`Store.claim`'s positional arguments after the keys and the task id."""
        return self.token, self.lease_ms, HOST, self.pid, int(self.now)

    def options(self) -> dict[str, Any]:
        """:meth:`Store.claim`'s keyword arguments."""
        return {
            "keep_record": self.spec.until == "window",
            "record_ttl_ms": self.record_ttl_ms,
            "accepted": self.accepted,
        }


_sent = threading.local()


def keep(claim: Claim) -> None:
    """The claim this thread sent last, for its run to read."""
    _sent.claim = claim


def take(task_id: str) -> Claim | None:
    """The claim this thread sent for ``task_id``, once; None if it sent none."""
    claim: Claim | None = getattr(_sent, "claim", None)
    if claim is None:
        return None
    _sent.claim = None
    return claim if claim.task_id == task_id else None
