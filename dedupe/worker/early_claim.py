"""A run's claim, and the claim sent as the worker accepts its message, read as the run starts.

In Celery's solo and threads pools the thread that accepts a message runs it: Celery's own
work comes between the two (its bookkeeping, the task-started event, the trace's set-up),
and a claim sent at the first has its round trip overlap that work instead of following
it. Any other pool (prefork, gevent, eventlet, a custom one) claims as the run starts, on
the running process's or greenlet's own connection. So does a task with ``acks_late``: its
message stays with the broker until the run ends, and a claim whose run never came would
hold the key until the broker delivers it again.

A claim sent whose run never reads it (Celery could not run the message: it reports an
internal error before ``task_prerun``) is released then, or at the thread's next
acceptance; failing both, its lease frees the key, as a killed run's would.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from celery.concurrency import solo, thread

from dedupe.errors import RedisUnavailable
from dedupe.runs.run import RunSpec, new_token
from dedupe.store.connections import Reply
from dedupe.values.record import HOST
from dedupe.values.timing import milliseconds

__all__ = ["Claim", "keep", "pool_accepts_in_place", "sends_at_acceptance", "take", "take_any"]


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
    #: The task's name, for what is said of a claim given back by another request.
    name: str = ""
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

#: This process's worker pool runs a message in the thread that accepted it (set as the
#: worker starts; a prefork child inherits its parent's False).
_in_place = False


#: Celery's own pools that run a message where they accept it, as a worker may name them
#: (their aliases, and their paths).
_IN_PLACE = frozenset(
    {"solo", "threads", "celery.concurrency.solo:TaskPool", "celery.concurrency.thread:TaskPool"}
)


def pool_accepts_in_place(pool_cls: Any) -> None:
    """Note the worker's pool (``WorkController.pool_cls``, a name or a class): only
    Celery's own solo and threads pools, exactly, run a message where they accept it.
    (A name is not imported: Celery loads the pool after ``worker_init``, so that its
    handlers may patch first, for gevent.)"""
    global _in_place
    if isinstance(pool_cls, str):
        _in_place = pool_cls in _IN_PLACE
    else:
        _in_place = pool_cls is not None and pool_cls in (solo.TaskPool, thread.TaskPool)


def sends_at_acceptance() -> bool:
    """Does this process's worker send claims as it accepts messages?"""
    return _in_place


def keep(claim: Claim) -> None:
    """The claim this thread sent last, for its run to read."""
    _sent.claim = claim


def take(task_id: str) -> Claim | None:
    """The claim this thread sent for ``task_id``, once; None if it sent none."""
    claim: Claim | None = getattr(_sent, "claim", None)
    if claim is None or claim.task_id != task_id:
        return None  # (another task id's stays, for take_any() to give back)
    _sent.claim = None
    return claim


def take_any() -> Claim | None:
    """The claim this thread sent whose run never read it, if any (once)."""
    claim: Claim | None = getattr(_sent, "claim", None)
    _sent.claim = None
    return claim
