"""The CLI's view of the calls waiting for their turn (``key_concurrency``'s lines, the
planned starts of ``key_rate_limit``): ``celery dedupe list`` and ``show`` print them after
the records, with their key, position in line and, for a planned start, when it is due."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import click
from celery import Celery

from .runs.inventory import glob_escaped, task_keys_pattern
from .runs.runtime import installed
from .store.commands.lines import WaitingCall
from .surfaces import AnyTask
from .values.key_derivation import keys_for
from .values.limits import limit_keys
from .values.options import options_for

__all__ = ["echo_waiting", "waiting_line", "waiting_of"]


def echo_waiting(app: Celery, task: str | None, most: int) -> int:
    """Print the calls waiting for their turn (of ``task``, when given), ``most`` at most:
    how many were printed."""
    runtime = installed(app)
    assert runtime is not None
    if most <= 0 or runtime.store.server is None:
        return 0  # (no look over a Cluster's nodes here)
    prefix = glob_escaped(runtime.config.key_prefix)
    waiting = runtime.store.waiting_under(prefix, task_keys_pattern(task), most)
    for call in waiting:
        click.echo(waiting_line(call))
    return len(waiting)


def waiting_line(call: WaitingCall) -> str:
    """One line of ``list``: handed or waiting, when due, task id, key and position."""
    due = "-"
    if call.due_at is not None:
        due = f"in {max(call.due_at - time.time(), 0):.0f}s"
    state = "handed" if call.handed else "waiting"
    return f"{state:<11} {'-':>7} {due:>10}  {call.task_id:<36}  {call.key} #{call.position}"


def waiting_of(
    app: Celery,
    task: AnyTask | str,
    args: Sequence[object] | None,
    kwargs: Mapping[str, object] | None,
) -> list[WaitingCall]:
    """The calls waiting their turn in the line (or the planned starts) of a call's key;
    none for a task this process does not import, or that has no limit."""
    runtime = installed(app)
    assert runtime is not None
    if isinstance(task, str):
        return []
    options = options_for(task, task.name, runtime.config)
    if not options.limited:
        return []
    keys = keys_for(runtime.config.key_prefix, task, task.name, options, args, kwargs)
    limited = limit_keys(keys.call)
    return [*runtime.store.waiting_calls(limited), *runtime.store.planned_starts(limited)]
