"""A run's claim of its key: what it writes (:class:`RunClaim`), and the run it makes, claimed
(its lease renewed by the heartbeat), held by another run, or unguarded (Redis unreachable)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from dedupe.compat.celery_private import pool_process_terminating
from dedupe.errors import RedisUnavailable
from dedupe.events import CLAIMED, UNAVAILABLE, emit
from dedupe.runs.liveness import run_is_dead
from dedupe.runs.run import Run, RunSpec, new_token
from dedupe.runs.runtime import Runtime
from dedupe.store.commands.leases import Lease
from dedupe.store.connections import Reply
from dedupe.surfaces import TaskSurface
from dedupe.values.options import GUARDS_RUNS
from dedupe.values.record import HOST, Holder, pack_running
from dedupe.values.redelivery import horizon
from dedupe.values.timing import milliseconds

__all__ = ["RunClaim", "claim_run", "record_ttl_ms"]

logger = logging.getLogger("dedupe.worker")
keys_logger = logging.getLogger("dedupe.keys")


@dataclass(slots=True)
class RunClaim:
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
    ) -> RunClaim:
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


def claim_run(runtime: Runtime, task: TaskSurface, claim: RunClaim) -> Run:
    """Claim the run's key, or read the claim sent as its message was accepted."""
    spec, task_id = claim.spec, claim.task_id
    store = runtime.store
    try:
        if claim.error is not None:
            raise claim.error
        if claim.slot is None:
            holder = store.claim(spec.keys, task_id, *claim.arguments(), **claim.options())
        else:
            holder = store.claim_result(spec.keys, claim.slot)
        if holder is not None and _own_dead_run(holder, task_id):
            holder = _take_over(runtime, task, claim, holder)
    except RedisUnavailable as exc:
        # The message is consumed already: running it beats losing it. (Its end frees
        # what a claim that landed unanswered wrote.)
        action = "runs unguarded"
        emit(UNAVAILABLE, task.name, task_id, spec.keys.run, action=action, error=exc.cause)
        return Run(spec, claim.token, "error")
    except Exception as exc:
        # Cut short while its answer was awaited (a soft time limit, in task_prerun: Celery
        # runs the body all the same). Its fate unknown, as when Redis does not answer: the
        # run goes on unguarded, holding what the claim wrote if it landed, and its end
        # frees that and the message's queued record.
        logger.warning(
            "%s[%s] was interrupted as it claimed %s (%r): it runs unguarded",
            task.name,
            task_id,
            spec.keys.run,
            exc,
        )
        return Run(spec, claim.token, "error")
    return _claimed(runtime, task, claim, holder)


def _own_dead_run(holder: Holder, task_id: str) -> bool:
    # A run of this very task id whose process is gone: Celery requeued its message after
    # losing the process (reject_on_worker_lost) and sent no end signal, so nothing freed
    # its key. Only a run of this host can be known dead; any other waits out its lease.
    return holder.task_id == task_id and holder.run_token is not None and run_is_dead(holder)


def _take_over(runtime: Runtime, task: TaskSurface, claim: RunClaim, dead: Holder) -> Holder | None:
    """Claim again, replacing exactly the dead run (its token): a second round trip, on this
    rare path only. None: the key is this run's now; else what holds it instead."""
    spec, task_id = claim.spec, claim.task_id
    replacing = dead.run_token or ""
    holder = runtime.store.claim(
        spec.keys, task_id, *claim.arguments(), replacing=replacing, **claim.options()
    )
    if holder is None:
        keys_logger.warning(
            "%s[%s] took over the key of its own dead run (%s, its process gone; its message "
            "was delivered again): %s",
            task.name,
            task_id,
            dead.worker,
            spec.keys.run,
        )
    return holder


def _claimed(runtime: Runtime, task: TaskSurface, claim: RunClaim, holder: Holder | None) -> Run:
    spec, task_id = claim.spec, claim.task_id
    if holder is not None:
        if not getattr(task, GUARDS_RUNS, False):
            logger.warning(
                "%s[%s] runs while %s holds its key: only tasks with base=dedupe.DedupeTask "
                "are kept from running concurrently",
                task.name,
                task_id,
                holder.task_id,
            )
        return Run(spec, claim.token, "held", holder=holder)
    record = pack_running(task_id, claim.token, HOST, claim.pid, claim.now)
    call_key = spec.keys.call if spec.keys.call != spec.keys.run else ""
    lease = Lease(
        spec.keys.run, task_id, claim.token, claim.lease_ms, record, claim.record_ttl_ms, call_key
    )
    runtime.heartbeat.hold(lease, task.name)
    emit(CLAIMED, task.name, task_id, spec.keys.run)
    terminating = pool_process_terminating()
    return Run(spec, claim.token, "claimed", lease=lease, started_terminating=terminating)


def record_ttl_ms(runtime: Runtime, task: TaskSurface, spec: RunSpec) -> int:
    """How long the running record outlives each renewal: until the broker delivers the
    message again, for a run that holds an unacked message (acks_late: a worker killed
    whole leaves it with the broker); 0, the lease alone, for any other run (its message
    was acked when received, and a dead run's key is free once its lease is over). Only
    with unique_until="finished": the other modes' run lock is a mutex alone (their calls
    are accepted during a run by design), and holding it for a redelivery would only make
    the calls queued behind it wait out the broker's timeout."""
    if not task.acks_late or spec.until != "finished":
        return 0
    return milliseconds(horizon(runtime.broker.redelivery, spec.lease, spec.ttl))
