"""What the Redis broker did with each message, read from its ``MONITOR`` stream.

kombu's Redis transport takes a message with ``BRPOP`` and then records it in its ``unacked``
hash (``HSET``) in a second command: a worker killed between the two, or a broker that shuts
down as it serves the ``BRPOP``, loses the message. Snapshots of the queue and the hash taken
around a kill see that loss only if the pop came after the first snapshot; a worker that popped
a few milliseconds before it (seen here: 3 ms) hides it, and the message then counts as one the
library lost. The broker's own log settles it: a task id pushed into the queue and never
written to the ``unacked`` hash after its last push was popped by a consumer that never
recorded it.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from .evidence import Fault

#: How long after a message's pop (bounded by the next message's unacked write) the kill or
#: cut that lost it may come: kombu writes the unacked record milliseconds after the pop.
POP_SLACK = 1.0

#: ``<time> [<db> <client>] "<COMMAND>" "<key>" ...`` as ``redis-cli monitor`` prints it.
_LINE = re.compile(r'^(\d+\.\d+) \[\d+ [^\]]+\] "([A-Z]+)" "([^"]*)"')
#: The task id of a Celery protocol 2 message inside a quoted argument (``\"id\": \"...\"``;
#: the backslash before the name leaves out ``root_id`` and ``parent_id``).
_TASK_ID = re.compile(r'\\"id\\": \\"([0-9a-f-]{36})\\"')


def monitor(port: int, path: Path, stack: contextlib.ExitStack) -> Callable[[], None]:
    """Append every command the Redis on ``port`` runs to ``path`` until ``stack`` closes or
    the returned function is called, attaching again after the server restarts (a cut)."""
    stop = threading.Event()

    def loop() -> None:
        with open(path, "ab") as out:
            while not stop.is_set():
                # (Its complaints while the server is down would bury the run's report.)
                proc = subprocess.Popen(
                    ["redis-cli", "-p", str(port), "monitor"],
                    stdout=out,
                    stderr=subprocess.DEVNULL,
                )
                while proc.poll() is None and not stop.is_set():
                    time.sleep(0.01)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                time.sleep(0.01)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()

    def close() -> None:
        stop.set()
        thread.join(5)

    stack.callback(close)
    return close


@dataclass(frozen=True)
class Unrecorded:
    """A message popped and never recorded as unacked after its last push."""

    task_id: str
    pushed: float  # its last push (the server's clock, which is the harness's)
    #: The pop came before this: the first unacked write of a message pushed after it (a
    #: queue is first in, first out); None when none came.
    popped_by: float | None


def unrecorded(lines: Iterable[str], queue: str) -> list[Unrecorded]:
    """The task ids pushed into ``queue`` (or its priority lists) whose last push no
    ``HSET unacked`` of theirs followed."""
    pushes: list[tuple[float, str]] = []
    last_push: dict[str, float] = {}
    recorded: dict[str, list[float]] = {}
    for line in lines:
        found = _LINE.match(line)
        if found is None:
            continue
        at, command, key = float(found[1]), found[2], found[3]
        task_id = _TASK_ID.search(line)
        if task_id is None:
            continue
        if command in ("LPUSH", "RPUSH") and key.startswith(queue):
            pushes.append((at, task_id[1]))
            last_push[task_id[1]] = at
        elif command == "HSET" and key == "unacked":
            recorded.setdefault(task_id[1], []).append(at)
    lost = []
    for index, (at, task_id) in enumerate(pushes):
        if last_push[task_id] != at:
            continue
        if any(when >= at for when in recorded.get(task_id, [])):
            continue
        lost.append(Unrecorded(task_id, at, _first_recorded(pushes[index + 1 :], recorded)))
    return lost


def _first_recorded(
    later: list[tuple[float, str]], recorded: dict[str, list[float]]
) -> float | None:
    """The first unacked write of any of the ``later`` pushes (each after its own push)."""
    times = [
        when for pushed, task_id in later for when in recorded.get(task_id, []) if when >= pushed
    ]
    return min(times, default=None)


def popped_at(faults: list[Fault], lost: list[Unrecorded], held: set[str]) -> list[Fault]:
    """``faults``, each whole-worker kill or broker cut with the ``lost`` messages it took
    added to those that vanished at it: the first such fault after the message's last push,
    no later than :data:`POP_SLACK` after its pop. A message still ``held`` by the broker
    was not lost; one popped with no such fault is left out, to count as the library's."""
    vanished: dict[int, set[str]] = defaultdict(set)
    for message in lost:
        if message.task_id in held:
            continue
        for index, fault in enumerate(faults):
            if fault.kind not in ("worker kill", "broker cut") or fault.start < message.pushed:
                continue
            if message.popped_by is None or fault.start <= message.popped_by + POP_SLACK:
                vanished[index].add(message.task_id)
            break
    return [
        replace(fault, vanished=fault.vanished | vanished[index])
        for index, fault in enumerate(faults)
    ]


def only_lost(waiting: list[str], lost: list[Unrecorded]) -> bool:
    """Does every line of the keys left that waits (a record, a place in line) name a
    message that was popped and never recorded? Then nothing it waits for will come."""
    ids = {message.task_id for message in lost}
    return all(any(task_id in line for task_id in ids) for line in waiting)


def read(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as lines:
        yield from lines
