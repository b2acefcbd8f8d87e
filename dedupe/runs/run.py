"""The state of one run of a task inside a worker, kept on the task's request.

A run's life: the worker claims its key (``claimed``), finds it held by another run
(``held``), or cannot ask Redis (``error``); a continuation of the task id (a retry, a
replace) may take the key over (:meth:`Run.hand_over`); the run's end releases what is left.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Literal

from celery import Celery

from dedupe.store.commands.leases import Lease
from dedupe.values.config import DedupeConfig
from dedupe.values.keys import CallKeys
from dedupe.values.latest import Latest
from dedupe.values.options import GUARDS_RUNS, UniqueOptions, Until, options_for, until_of
from dedupe.values.record import Holder

from .heartbeat import Heartbeat

__all__ = [
    "ANY_RUN",
    "NO_RUN",
    "Run",
    "RunSpec",
    "acks_late_leases",
    "attach",
    "detach",
    "new_token",
    "run_of",
]

#: The run token of a run that holds nothing: it matches no record.
NO_RUN = "-"
#: Speaks for whatever run of the task id holds the key: only when that run is known dead,
#: or when the key is released by a run that never claimed it.
ANY_RUN = ""

_ATTRIBUTE = "_dedupe_run"


def new_token() -> str:
    """A run token: tells the runs of one task id apart (48 bits, small in every record)."""
    return secrets.token_hex(6)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What the worker needs to guard one run: from the header, or derived for a bypass."""

    keys: CallKeys
    until: Until
    #: Seconds a record re-queued by a retry lives (plus the retry's countdown).
    ttl: float
    lease: float
    on_running: Literal["skip", "retry"]
    running_countdown: float
    #: The message belongs to a chain, group or chord: it must never be skipped.
    canvas: bool
    #: The message went through the producer guard (it carries our header): its task id
    #: may have been handed to callers as the holder of the call, so it must never be
    #: skipped either (a skip stores no result, and their .get() would never return).
    carried: bool = False

    @classmethod
    def from_options(
        cls,
        keys: CallKeys,
        until: object,
        ttl: float,
        options: UniqueOptions,
        *,
        canvas: bool,
        carried: bool = False,
    ) -> RunSpec:
        return cls(
            keys=keys,
            until=until_of(until),
            ttl=ttl,
            lease=options.lease,
            on_running=options.on_running,
            running_countdown=options.running_countdown,
            canvas=canvas,
            carried=carried,
        )


@dataclass(eq=False)
class Run:
    """One run: its claim verdict, and what happened to its key during the run."""

    spec: RunSpec
    token: str
    #: ``early``: a debounced message that came before its burst's deadline; it claims
    #: nothing and is sent again for the deadline (:attr:`latest` says when, and with what).
    verdict: Literal["claimed", "held", "error", "early"]
    holder: Holder | None = None
    lease: Lease | None = None
    #: What the call's duplicates left for this run (debounce, replace), if anything.
    latest: Latest | None = None
    #: The arguments the run takes in place of its message's: the latest call's.
    arguments: tuple[list[object], dict[str, object]] | None = None
    #: Its process was on its way out as it started (a pool process that swallowed the
    #: SystemExit of its worker's terminate): its end is its own, not the terminate's.
    started_terminating: bool = False
    #: A continuation (retry, replace) put this key back to queued: its message owns it.
    #: A continuation to another key (new arguments, another task) leaves it False, and
    #: the run's own key is released at the end.
    requeued: bool = False
    #: A continuation of this task id was published during the run: the key goes back to
    #: queued for it when the run ends, ``(ttl, eta)`` of its record.
    handover: tuple[float, float | None] | None = None
    #: The key was released as the body ended, before the result was stored.
    released: bool = False

    def hand_over_at_end(self, task: object, keys: CallKeys, ttl: float, eta: float | None) -> bool:
        """Keep the key until this run ends, then hand it to a continuation of its task id
        published now (``retry(throw=False)`` goes on running after it; a raised retry ends
        at once). Before that, the continuation would start beside this run; as it is, it
        meets this run's record and waits. False: this run holds nothing to hand over at
        its end, or its task's runs are not kept apart, so a continuation that started
        early would run anyway (:meth:`hand_over` hands the key over now)."""
        if (
            self.verdict != "claimed"
            or self.spec.keys != keys
            or self.requeued
            or self.released  # (the body is over: the key goes to the continuation now)
            or not getattr(task, GUARDS_RUNS, False)
        ):
            return False
        self.handover = (ttl, eta)
        return True

    def hand_over(self, keys: CallKeys, heartbeat: Heartbeat) -> str:
        """Let a continuation of this run's task id take the key ``keys`` back to queued.

        Returns the run token the requeue speaks for: this run's own, ANY_RUN for a run
        that never claimed (its claim failed), or NO_RUN when there is nothing to hand over
        (a run that met a live holder must never touch the holder's record; a continuation
        to another key leaves this run's key to be released when the run ends).
        """
        if self.verdict == "held" or self.spec.keys != keys:
            return NO_RUN
        if self.lease is not None:
            # Stop renewing before the record goes back to queued: a late renewal would find
            # it queued and give up the lease, or re-create a running record.
            heartbeat.drop(self.lease)
            self.lease = None
        self.requeued = True
        return self.token if self.verdict == "claimed" else ANY_RUN


def run_of(request: object) -> Run | None:
    """The run attached to a task request, if any."""
    run = getattr(request, _ATTRIBUTE, None)
    return run if isinstance(run, Run) else None


def attach(request: object, run: Run) -> None:
    setattr(request, _ATTRIBUTE, run)


def detach(request: object) -> Run | None:
    run = run_of(request)
    if run is not None:
        setattr(request, _ATTRIBUTE, None)
    return run


def acks_late_leases(app: Celery, config: DedupeConfig) -> list[tuple[str, float]]:
    """(name, lease) of each guarded ``acks_late`` task whose key stays until its run
    finished: what the Redis broker's visibility timeout must not outlast by much
    (:func:`dedupe.values.redelivery.visibility_gap`). Raises a task's invalid options."""
    return [
        (name, options.lease)
        for name, task in app.tasks.items()
        if getattr(task, GUARDS_RUNS, False) and task.acks_late
        for options in (options_for(task, name, config),)
        if options.until == "finished"
    ]
