"""Is the run in a record dead? What the worker's main process may release for a task id.

The main process acts for a task id outside any run: after a child died, on a revoke, on a
hard time limit, when ``retry_on_worker_lost`` sends the task again. It may act for "any run"
of that task id only when the run in the record is known dead (it ran on this host and its
process is gone) or is being killed by this process; a live copy of the task, in another
child or on another host, is never touched.
"""

from __future__ import annotations

import os

from dedupe.store.store import Store
from dedupe.values.keys import CallKeys
from dedupe.values.record import HOST, Holder

from .run import ANY_RUN, NO_RUN

__all__ = ["lost_run_token", "run_is_dead"]


def lost_run_token(store: Store, keys: CallKeys, *, killing: bool = False) -> str:
    """The run token the main process may act with: ANY_RUN when no live run holds the key,
    else NO_RUN (which leaves a running record alone).

    ``killing``: the main process is killing the run itself (a hard time limit, a revoke with
    terminate); Celery reports those before the process is gone. Costs one read, on these rare
    paths only.
    """
    holder = store.lookup(keys)
    if holder is None or holder.state == "queued":
        return ANY_RUN
    if killing and _pid_here(holder) is not None:
        return ANY_RUN
    return ANY_RUN if run_is_dead(holder) else NO_RUN


def run_is_dead(holder: Holder) -> bool:
    """True when ``holder`` is a run of this host whose process is gone."""
    pid = _pid_here(holder)
    return pid is not None and not _alive(pid)


def _pid_here(holder: Holder) -> int | None:
    host, _, pid = (holder.worker or "").rpartition(":")
    return int(pid) if host == HOST and pid.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Has ``pid`` ended, and its parent not reaped it yet? (Linux: its state in /proc. A
    worker whose event loop waits for the broker reaps its pool's children late.)"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[:1] == [b"Z"]
    except OSError:
        return False
