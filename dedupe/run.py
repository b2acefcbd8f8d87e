"""The state of one run of a task inside a worker, kept on the task's request."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from .keys import CallKeys
from .record import Holder
from .store import Lease, Store

__all__ = [
    "ANY_RUN",
    "HEADER",
    "NO_RUN",
    "Carried",
    "Run",
    "RunSpec",
    "attach",
    "carried_by",
    "detach",
    "is_publishing",
    "main_process_token",
    "new_token",
    "publishing",
    "run_of",
]

#: The message header that carries a call's key to the worker. Namespaced: Celery merges
#: user headers over its protocol fields.
HEADER = "celery_dedupe"

#: The run token of a run that holds nothing: it matches no record.
NO_RUN = "-"

_ATTRIBUTE = "_dedupe_run"


@dataclass(frozen=True, slots=True)
class Carried:
    """What a message's header says about its call: decided once, by the producer."""

    keys: CallKeys
    until: Literal["finished", "started"]
    ttl: float | None

    def header(self) -> dict[str, Any]:
        return {"key": self.keys.record, "until": self.until, "ttl": self.ttl}


def carried_by(headers: Mapping[str, Any] | None) -> Carried | None:
    """The call a message's headers carry, or None for a message without our header."""
    header = (headers or {}).get(HEADER)
    if not isinstance(header, Mapping) or "key" not in header:
        return None
    record = str(header["key"])
    started = header.get("until") == "started"
    ttl = header.get("ttl")
    return Carried(
        CallKeys(record, f"{record}:run" if started else record),
        "started" if started else "finished",
        float(ttl) if isinstance(ttl, (int, float)) else None,
    )


_publishing: ContextVar[bool] = ContextVar("dedupe_publishing", default=False)


class publishing:
    """Marks a publish that the producer guard decided itself: ``with publishing(): ...``.

    (main_process.on_before_publish leaves those alone.) A class, not a generator context
    manager: every accepted call goes through it.
    """

    __slots__ = ("_reset",)

    def __enter__(self) -> None:
        self._reset = _publishing.set(True)

    def __exit__(self, *exc_info: object) -> None:
        _publishing.reset(self._reset)


def is_publishing() -> bool:
    return _publishing.get()


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What the worker needs to guard one run: from the header, or derived for a bypass."""

    keys: CallKeys
    until: Literal["finished", "started"]
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


@dataclass(eq=False)
class Run:
    """One run: its claim verdict, and what happened to its key during the run."""

    spec: RunSpec
    token: str
    verdict: Literal["claimed", "held", "error"]
    holder: Holder | None = None
    lease: Lease | None = None
    #: A continuation (retry, replace) put this key back to queued: its message owns it.
    #: A continuation to another key (new arguments, another task) leaves it False, and
    #: the run's own key is released at the end.
    requeued: bool = False


#: Speaks for whatever run of the task id holds the key: only when that run is known dead.
ANY_RUN = ""

_HOST = socket.gethostname()


def main_process_token(store: Store, keys: CallKeys, *, killing: bool = False) -> str:
    """The run token the worker's main process may act with for a task id outside any run
    (a lost child, a revoke, retry_on_worker_lost): ANY_RUN when no live run holds the key,
    else NO_RUN, which leaves a running record alone.

    A run is known dead when it ran on this host and its process is gone: the main process
    acts for its own dead children, never over a copy of the task that still runs (another
    child, another host). ``killing``: the main process is killing the run itself (a hard
    time limit, a revoke with terminate); Celery reports those before the process is gone.
    Costs one read, on these rare paths only.
    """
    holder = store.lookup(keys)
    if holder is None or holder.state == "queued":
        return ANY_RUN
    host, _, pid = (holder.worker or "").rpartition(":")
    if host == _HOST and pid.isdigit() and (killing or not _alive(int(pid))):
        return ANY_RUN
    return NO_RUN


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def new_token() -> str:
    # 48 bits: enough to tell apart the runs of one task id, small in every record.
    return secrets.token_hex(6)


def run_of(request: Any) -> Run | None:
    """The run attached to a task request, if any."""
    run = getattr(request, _ATTRIBUTE, None)
    return run if isinstance(run, Run) else None


def attach(request: Any, run: Run) -> None:
    setattr(request, _ATTRIBUTE, run)


def detach(request: Any) -> Run | None:
    run = run_of(request)
    if run is not None:
        setattr(request, _ATTRIBUTE, None)
    return run
