"""What the chaos run checks, from its evidence: every call (producers), every run's start and
end with its pid (the tasks), and the faults the harness injected, with their times.

A duplicate is an accepted call B whose call returned before an earlier accepted call A of the
same key stopped holding it: A's last run ended (``unique_until="finished"``), or the prerun of
A's first delivery that the guard did not defer, which comes before its claim (``"started"``:
the claim frees the call's key, even when the process is killed before the task's body could
write its start). Both bounds are ones no correct library can cross, whatever the clocks of the
processes say (one host, one clock).
"""

from __future__ import annotations

import bisect
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from dedupe.values.limits import LIMIT_KEY_NAMES
from tests.helpers import RunLog

#: The dedup tasks the first rows judge (the flow-control tasks have rows of their own).
TASKS = ("finished", "started")
#: The side producer's tasks: one whose queue a purge empties, one no worker registers.
PURGEABLE, UNKNOWN = "purgeable", "unknown"
DEBOUNCED = "debounced"
#: The flow-control tasks of issue 31: ``limited`` (``key_concurrency=LIMIT``), ``rated``
#: (``key_rate_limit``: RATE starts per PERIOD seconds) and ``paced``, with both
#: (``key_concurrency=PACED_LIMIT, key_rate_limit``: PACED_RATE per PERIOD). Every call is
#: accepted and runs.
LIMITED, RATED, PACED = "limited", "rated", "paced"
LIMIT = 2
RATE, PERIOD = 3, 1.0
PACED_LIMIT, PACED_RATE = 1, 3
#: The flow-control tasks, and the limits each declares: at most so many runs of a key at
#: once (CONCURRENCY), at most so many starts of a key in any PERIOD (RATES).
FLOW = (LIMITED, RATED, PACED)
CONCURRENCY = {LIMITED: LIMIT, PACED: PACED_LIMIT}
RATES = {RATED: RATE, PACED: PACED_RATE}
#: How the rows of all of them are named ("limited / rated / paced: ...").
FLOW_ROWS = " / ".join(FLOW)
#: The keys of the limits (dedupe.values.limits.limit_keys), after the call key's hash tag.
LIMIT_SUFFIXES = tuple(f":{name}" for name in LIMIT_KEY_NAMES)


@dataclass(frozen=True)
class Call:
    task: str
    key: int
    task_id: str
    deduplicated: bool
    start: float
    end: float
    error: str = ""
    pid: int = 0  # the producer's
    #: A duplicate answered from the producer thread's memory (no round trip).
    remembered: bool = False
    #: The argument of a flow-control call (debounced: one more than the key's call before).
    arg: int | None = None

    def encode(self) -> str:
        return json.dumps(
            [
                self.task,
                self.key,
                self.task_id,
                self.deduplicated,
                self.start,
                self.end,
                self.error,
                self.pid,
                self.remembered,
                self.arg,
            ]
        )

    @classmethod
    def decode(cls, raw: bytes | str) -> Call:
        return cls(*json.loads(raw))


@dataclass(frozen=True)
class Fault:
    """One injected fault, or a worker the harness had to restart (``stall``)."""

    kind: str  # child kill, worker kill, dedup restart, broker cut, stall
    start: float
    end: float
    detail: str = ""
    #: A whole-worker kill or a broker cut on the Redis broker: task ids in the queue just
    #: before it that were neither in the queue nor in kombu's unacked hash just after it.
    vanished: frozenset[str] = frozenset()
    #: A purge: the task ids of the messages it took off the side queue (never to run).
    purged: frozenset[str] = frozenset()


@dataclass
class Evidence:
    calls: list[Call]
    runs: dict[tuple[str, int], list[tuple[str, float, float | None]]]
    #: Task id -> when each of its runs ended on its own (not with a killed process).
    completed: dict[str, list[float]]
    overlaps: dict[tuple[str, int], list[Any]]
    #: Task id -> (time, pid) of each delivery's prerun, which comes before its claim.
    prerun: dict[str, list[tuple[float, int]]]
    faults: list[Fault]
    keys_left: list[str]
    t0: float
    #: The library's warnings in the producers: "<time> <pid> <logger>: <message>".
    warnings: list[str] = field(default_factory=list)
    #: Task ids the Redis broker still held after the drain (queued or unacked).
    held: set[str] = field(default_factory=set)
    #: Task id -> (time, pid) of each delivery the guard deferred (its claim was held).
    deferred: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    #: Task id -> (time, pid) of each time a worker's main process freed its key for a run it
    #: lost, Celery acking the message as failed (key_reclaimed, not requeued).
    freed: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    #: Task id -> (time, pid) of each delivery that ended as RETRY (a deferral, or a debounced
    #: message before its deadline, sent again): it claimed nothing.
    retried: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    #: Task id -> (time, argument, pid) of each debounced run, as its body began.
    ran: dict[str, list[tuple[float, int, int]]] = field(default_factory=dict)
    #: Task id -> (time, pid, action) of each time the dedup Redis could not be asked for it
    #: (dedupe.events.redis_unavailable): what was done instead.
    unavailable: dict[str, list[tuple[float, int, str]]] = field(default_factory=dict)
    #: Task id -> (time, pid) of each time a worker's main process saw the child that had
    #: its message die (task_failure with WorkerLostError): Celery acked it as failed.
    worker_lost: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    #: (task id, body start) -> the pid of that run (from the run logs).
    run_pids: dict[tuple[str, float], int] = field(default_factory=dict)
    #: Task id -> (time, pid, exception name) of each delivery that failed (task_failure,
    #: but for WorkerLostError: ``worker_lost``).
    failed: dict[str, list[tuple[float, int, str]]] = field(default_factory=dict)
    #: The side producer's calls (SIDE_TASKS): to the side queue, which a purge empties, and
    #: of a task no worker knows.
    side_calls: list[Call] = field(default_factory=list)

    @classmethod
    def read(
        cls,
        client: redis.Redis,
        prefix: str,
        faults: list[Fault],
        keys_left: list[str],
        killed: dict[int, float],
        t0: float,
    ) -> Evidence:
        calls = [Call.decode(raw) for raw in client.lrange(f"{prefix}:calls", 0, -1)]
        side = [Call.decode(raw) for raw in client.lrange(f"{prefix}:side-calls", 0, -1)]
        runs, overlaps = {}, {}
        completed: dict[str, list[float]] = defaultdict(list)
        run_pids: dict[tuple[str, float], int] = {}
        for task, key in {(call.task, call.key) for call in [*calls, *side]}:
            log = RunLog(client, f"{prefix}:{task}:{key}")
            for raw in client.lrange(log.name, 0, -1):
                kind, task_id, at, pid = raw.decode().split()
                if kind == "start":
                    run_pids[(task_id, float(at))] = int(pid)
            runs[(task, key)] = log.runs(killed)
            overlaps[(task, key)] = log.overlaps(killed)
            for task_id, _, end in log.runs():
                if end is not None:
                    completed[task_id].append(end)
        prerun, deferred = _timed(client, f"{prefix}:prerun"), _timed(client, f"{prefix}:deferred")
        warnings = [raw.decode() for raw in client.lrange(f"{prefix}:warnings", 0, -1)]
        return cls(
            calls,
            runs,
            completed,
            overlaps,
            prerun,
            faults,
            keys_left,
            t0,
            warnings,
            set(),
            deferred,
            _timed(client, f"{prefix}:freed"),
            _timed(client, f"{prefix}:retried"),
            _ran(client, f"{prefix}:ran"),
            _unavailable(client, f"{prefix}:unavailable"),
            _timed(client, f"{prefix}:worker-lost"),
            run_pids,
            _unavailable(client, f"{prefix}:failed"),
            side,
        )


def _timed(client: redis.Redis, name: str) -> dict[str, list[tuple[float, int]]]:
    # "<task id> <time> <pid>" lines -> task id -> [(time, pid)], in time order.
    timed: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for raw in client.lrange(name, 0, -1):
        task_id, at, pid = raw.decode().split()
        timed[task_id].append((float(at), int(pid)))
    for times in timed.values():
        times.sort()
    return timed


def _ran(client: redis.Redis, name: str) -> dict[str, list[tuple[float, int, int]]]:
    # "<task id> <argument> <time> <pid> <key>" lines -> task id -> [(time, argument, pid)].
    ran: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
    for raw in client.lrange(name, 0, -1):
        task_id, arg, at, pid, _ = raw.decode().split()
        ran[task_id].append((float(at), int(arg), int(pid)))
    for runs in ran.values():
        runs.sort()
    return ran


def _unavailable(client: redis.Redis, name: str) -> dict[str, list[tuple[float, int, str]]]:
    # "<task id> <time> <pid> <text>" lines -> task id -> [(time, pid, text)].
    found: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    for raw in client.lrange(name, 0, -1):
        task_id, at, pid, action = raw.decode().split(" ", 3)
        found[task_id].append((float(at), int(pid), action))
    return found


@dataclass
class Row:
    check: str
    count: int
    verdict: str  # "ok", "FAIL", "not ours", "info"
    details: list[str] = field(default_factory=list)


def _ours_and_kombus(check: str, ours: list[str], kombus: str, transport: list[str]) -> list[Row]:
    """A check's row, which fails on any line of ``ours``, and beside it the row of what the
    transport did (``transport``: shown, not ours)."""
    return [
        Row(check, len(ours), _fail(ours), ours),
        Row(kombus, len(transport), "not ours" if transport else "ok", transport),
    ]


class Checks:
    """The checks, each a row of the table."""

    def __init__(self, evidence: Evidence, restart_window: float, broker: str) -> None:
        self.e = evidence
        self.window = restart_window
        self.broker = broker
        self.starts: dict[str, list[float]] = defaultdict(list)
        self.ends: dict[str, list[float]] = defaultdict(list)
        self.spans: dict[str, list[tuple[float, float | None]]] = defaultdict(list)
        self.debounced = {call.task_id for call in evidence.calls if call.task == DEBOUNCED}
        #: (task id, body start) -> the pid of that run.
        self.run_pids: dict[tuple[str, float], int] = dict(evidence.run_pids)
        for runs in evidence.runs.values():
            for task_id, start, end in runs:
                self.spans[task_id].append((start, end))
                self.starts[task_id].append(start)
                if end is not None:
                    self.ends[task_id].append(end)

    def t(self, at: float) -> str:
        """A time as seconds into the run."""
        return f"{at - self.e.t0:.2f}s"

    def history(self, task_id: str) -> str:
        """A task id's runs: ``start-end``, ``killed`` where its process was killed."""
        completed = self.e.completed.get(task_id, [])
        runs = ", ".join(
            f"{self.t(start)}-{self.t(end) if end else '?'}{'' if end in completed else ' killed'}"
            for start, end in sorted(self.spans[task_id])
        )
        debounced = task_id in self.debounced
        # (A delivery killed after its prerun, before its body wrote a start.)
        claims = self.debounce_claims(task_id) if debounced else self.claims(task_id)
        unstarted = len(claims) - len(self.spans[task_id])
        if unstarted > 0:
            runs += f", {unstarted} killed before its body"
        if debounced and (again := len(self.e.retried.get(task_id, []))):
            runs += f", {again} sent again (early or deferred)"
        deferred = self.deferrals(task_id)
        return f"{runs}, {deferred} deferred" if deferred else runs

    def deferrals(self, task_id: str) -> int:
        """Deliveries of a task id that the guard deferred."""
        return len(self.e.deferred.get(task_id, []))

    def claims(self, task_id: str) -> list[float]:
        """The preruns of a task id's deliveries that the guard did not defer: each may have
        claimed its key (and, ``unique_until="started"``, freed its call's key), whether or not
        its body started before a kill."""
        return self._unmarked(task_id, self.e.deferred)

    def debounce_claims(self, task_id: str) -> list[float]:
        """The preruns of a debounced task id's deliveries that did not end as ``RETRY``:
        a delivery that came before its burst's deadline is sent again and claims nothing
        (nor does a deferred one); any other may have claimed the key, taking the latest
        arguments, whether or not its body started before a kill."""
        return self._unmarked(task_id, self.e.retried)

    def _unmarked(self, task_id: str, marked: dict[str, list[tuple[float, int]]]) -> list[float]:
        """The preruns of a task id's deliveries with no mark of ``marked`` of their own."""
        marks = set(marked.get(task_id, []))
        preruns = sorted(self.e.prerun.get(task_id, []))
        claims = []
        for index, (at, pid) in enumerate(preruns):
            # A child runs one delivery at a time: a deferral of this delivery comes after its
            # prerun and before that child's next prerun of this id (a later delivery's own).
            until = min((t for t, p in preruns[index + 1 :] if p == pid), default=float("inf"))
            own = [d for d in marks if d[1] == pid and at <= d[0] < until]
            if own:
                marks.discard(min(own))
            else:
                claims.append(at)
        return claims

    def deferral_row(self) -> Row:
        counts = {task_id: self.deferrals(task_id) for task_id in self.e.prerun}
        deferred = {task_id: count for task_id, count in counts.items() if count}
        calls = {call.task_id: call for call in self.e.calls if not call.deduplicated}
        waits = sorted(
            (min(self.starts[task_id]) - calls[task_id].start, task_id)
            for task_id in deferred
            if task_id in calls and self.starts.get(task_id)
        )
        most = max(deferred.items(), key=lambda item: item[1], default=("-", 0))
        lines = [
            f"{len(deferred)} task ids deferred {sum(deferred.values())} times; at most "
            f"{most[1]} ({most[0]})",
            *(
                f"{task_id}: {wait:.1f}s from call to first run, {deferred[task_id]} deferred"
                for wait, task_id in waits[-3:]
            ),
        ]
        return Row("deliveries deferred by the guard", sum(deferred.values()), "info", lines)

    def before(self, at: float) -> str:
        """The last fault that began before ``at``."""
        earlier = [fault for fault in self.e.faults if fault.start <= at]
        if not earlier:
            return "no fault before"
        fault = earlier[-1]
        return f"after {fault.kind} at {self.t(fault.start)} ({fault.detail})"

    def released(self, call: Call) -> float | None:
        """When an accepted call stopped holding its key at the latest; None if it never ran
        (``"started"``: never claimed).

        ``"finished"``: when its first run completed (a redelivery of a message whose run
        completed, its ack lost in a broker cut, is the broker's at-least-once, counted apart),
        else when its last run was killed (acked as failed: the message is gone). A run lost
        before that whose key the worker's main process freed as Celery acked it as failed
        (:meth:`acked_lost`) released it then: a run after it is the message again, its ack
        lost (the worker killed before the broker had it), counted apart.
        ``"started"``: the prerun of its first claim (:meth:`claims`).
        Debounced: the prerun of its first claim (:meth:`debounce_claims`), or when a worker's
        main process freed its key for a lost delivery (Celery acking it as failed).
        """
        starts = self.starts.get(call.task_id)
        if call.task == DEBOUNCED:
            freed = [at for at, _ in self.e.freed.get(call.task_id, [])]
            marks = self.debounce_claims(call.task_id) + (starts or []) + freed
            return min(marks, default=None)
        if call.task == "finished":
            if not starts:
                return None
            if completed := self.e.completed.get(call.task_id):
                return self.acked_lost(call.task_id) or min(completed)
            return max(self.ends[call.task_id], default=max(starts))
        return min(self.claims(call.task_id) + (starts or []), default=None)

    def acked_lost(self, task_id: str) -> float | None:
        """When the worker's main process freed the key of a lost run of ``task_id``, Celery
        acking it as failed, before any run of it completed (None: never)."""
        first = min(self.e.completed.get(task_id, []), default=float("inf"))
        return min((at for at, _ in self.e.freed.get(task_id, []) if at < first), default=None)

    def unrecorded(self) -> set[str]:
        """Task ids a producer published without dedup: the dedup Redis was unreachable (the
        restart) and ``dedupe_on_redis_error="enqueue"`` (the default) publishes anyway, by
        design. They hold no key, so they are nobody's duplicate and nobody's holder."""
        return {
            task_id
            for warning in self.e.warnings
            if "is published without dedup" in warning
            and (task_id := _task_id_in(warning.split(" ", 2)[2]))
        }

    def duplicates(self, tasks: Iterable[str] = TASKS) -> list[tuple[Call, Call]]:
        """(holder, duplicate) pairs of ``tasks``' calls: accepted calls made while another
        still held the key (debounced: a second burst while the first was queued)."""
        by_key: dict[tuple[str, int], list[Call]] = defaultdict(list)
        unrecorded = self.unrecorded()
        tasks = set(tasks)
        for call in self.e.calls:
            if (
                call.task in tasks
                and not call.error
                and not call.deduplicated
                and call.task_id not in unrecorded
            ):
                by_key[(call.task, call.key)].append(call)
        pairs = []
        for calls in by_key.values():
            calls.sort(key=lambda call: call.start)
            holder: Call | None = None
            held_until = 0.0
            for call in calls:
                if holder is not None and call.end < held_until:
                    pairs.append((holder, call))
                released = self.released(call)
                if released is not None and released > held_until:
                    holder, held_until = call, released
        return pairs

    def restart_caused(self, holder: Call, duplicate: Call) -> bool:
        """The holder's record may have been lost in a dedup-Redis restart (accepted before it
        ended), and the duplicate came within the window after it began."""
        return any(
            holder.start <= fault.end and fault.start <= duplicate.end <= fault.end + self.window
            for fault in self.e.faults
            if fault.kind == "dedup restart"
        )

    def duplicate_rows(
        self,
        tasks: Iterable[str] = TASKS,
        names: tuple[str, str, str] = (
            "duplicate queued outside a dedup-Redis restart window",
            "duplicates inside the restart window (<= 1 per key allowed)",
            "keys with more than one duplicate inside the window",
        ),
    ) -> list[Row]:
        outside: list[tuple[tuple[str, int], str]] = []
        inside: list[tuple[tuple[str, int], str]] = []
        for holder, duplicate in self.duplicates(tasks):
            line = (
                f"{duplicate.task}[{duplicate.key}] {duplicate.task_id} accepted "
                f"{self.t(duplicate.start)}-{self.t(duplicate.end)} while {holder.task_id} "
                f"(accepted {self.t(holder.start)}, runs {self.history(holder.task_id)}) held "
                f"the key until {self.t(self.released(holder) or 0)}; "
                f"{self.before(duplicate.start)}"
            )
            if any(duplicate.task_id in warning for warning in self.e.warnings):
                line += " [the producer warned about it: see the warnings row]"
            (inside if self.restart_caused(holder, duplicate) else outside).append(
                ((duplicate.task, duplicate.key), line)
            )
        per_key = Counter(key for key, _ in inside)
        crowded = [line for key, line in inside if per_key[key] > 1]
        return [
            Row(names[0], len(outside), _fail(outside), [line for _, line in outside]),
            Row(names[1], len(inside), "info", [line for _, line in inside]),
            Row(
                names[2],
                sum(1 for count in per_key.values() if count > 1),
                _fail(crowded),
                crowded,
            ),
        ]

    def wrong_holder_row(self) -> Row:
        """A duplicate answered with the task id of another key's accepted call: a reply
        read for another command (a connection out of step)."""
        owners = {
            call.task_id: (call.task, call.key)
            for call in self.e.calls
            if not call.error and not call.deduplicated and call.task_id
        }
        lines = [
            f"{call.task}[{call.key}] call {self.t(call.start)} answered with {call.task_id}, "
            f"the call of {owner[0]}[{owner[1]}]; {self.before(call.start)}"
            for call in self.e.calls
            if call.deduplicated
            and (owner := owners.get(call.task_id)) is not None
            and owner != (call.task, call.key)
        ]
        return Row("duplicates answered with another key's task", len(lines), _fail(lines), lines)

    def overlap_row(
        self, tasks: Iterable[str] = TASKS, name: str = "overlapping runs of one key"
    ) -> Row:
        lines = []
        tasks = set(tasks)
        for (task, key), pairs in self.e.overlaps.items():
            if task not in tasks:
                continue
            for (first, start, end), (second, other_start, other_end) in pairs:
                lines.append(
                    f"{task}[{key}] {first} {self.t(start)}-{self.t(end) if end else 'never'} "
                    f"overlaps {second} {self.t(other_start)}-"
                    f"{self.t(other_end) if other_end else 'never'}; {self.before(other_start)}"
                )
        return Row(name, len(lines), _fail(lines), lines)

    def lost_rows(self) -> list[Row]:
        """until=started: every call (accepted or not) has a run of its key starting after it,
        but for a call answered with a message kombu lost (its record names a task id whose
        message is gone: the transport's loss, shown apart)."""
        starts: dict[int, list[float]] = {
            key: sorted(start for _, start, _ in runs)
            for (task, key), runs in self.e.runs.items()
            if task == "started"
        }
        lost = {call.task_id for call in self.e.calls if self.lost_by_the_transport(call)}
        ours, transport = [], []
        for call in self.e.calls:
            if call.task != "started" or call.error:
                continue
            later = starts.get(call.key, [])
            if bisect.bisect_right(later, call.start) == len(later):
                (transport if call.task_id in lost else ours).append(
                    f"started[{call.key}] call {self.t(call.start)} answered with "
                    f"{call.task_id} (deduplicated={call.deduplicated}): no run started after "
                    f"it; {self.before(call.start)}"
                )
        return _ours_and_kombus(
            "lost calls (until=started: no run starting after the call)",
            ours,
            "kombu: calls answered with a message it lost (below)",
            transport,
        )

    def lost_by_the_transport(self, call: Call) -> Fault | None:
        """The kill or cut at which kombu lost this accepted call's message before any child
        had it: in the queue just before, in neither the queue nor the unacked hash after,
        never delivered (no prerun: one that reached a child was Celery's and ours)."""
        if call.error or call.deduplicated or call.task_id in self.starts:
            return None
        if call.task_id in self.e.prerun:
            return None
        return next((f for f in self.e.faults if call.task_id in f.vanished), None)

    def failures(self, task_id: str) -> str:
        """``; its delivery failed with <exception> at <t> (<the fault before>)`` for each
        failed delivery of a task id (a message sent again that could not be published, at a
        broker cut, fails the delivery that sent it), else ""."""
        return "".join(
            f"; its delivery failed with {name} at {self.t(at)} ({self.before(at)})"
            for at, _, name in self.e.failed.get(task_id, [])
        )

    def lost_message(self, task_id: str) -> Fault | None:
        """The kill or cut at which kombu lost the last message of a flow-control task id:
        in the queue just before it, in neither the queue nor the unacked hash after it, and
        no delivery of that task id to a child since. (A debounced or limited message is
        sent again under its task id, as an early or waiting delivery ends: the message lost
        may be such a re-sent one, after deliveries of the task id.)"""
        preruns = self.e.prerun.get(task_id, [])
        return next(
            (
                fault
                for fault in self.e.faults
                if task_id in fault.vanished and not any(at >= fault.start for at, _ in preruns)
            ),
            None,
        )

    def no_ttl_row(self) -> Row:
        """Every key the library writes has a time to live: one left with none (``ttl
        none``) would never be freed (a record, a latest-arguments hash, a limit's set)."""
        lines = [line for line in self.e.keys_left if " ttl none" in line]
        return Row("keys left with no ttl (never freed)", len(lines), _fail(lines), lines)

    def keys_left_rows(self) -> list[Row]:
        """Keys left after the drain: a failure, but for the key of a message kombu lost
        (its record names a task id whose message is gone: the transport's loss, shown)."""
        lost = {call.task_id for call in self.e.calls if self.lost_by_the_transport(call)}
        ours, transport = [], []
        for line in self.e.keys_left:
            if LATEST_LEFT in line or _limit_key(line):
                continue  # (no record: the debounced and limited rows judge it)
            if ENDED_LEFT in line:
                continue  # (a tombstone: no record, no arguments; it lives its horizon)
            holder = re.search(r" held by (\S+)$", line)
            (transport if holder and holder.group(1) in lost else ours).append(line)
        return _ours_and_kombus(
            "keys left after the drain",
            ours,
            "kombu: keys of the messages it lost (below), left",
            transport,
        )

    def never_ran_rows(self) -> list[Row]:
        ours, transport, celerys = [], [], []
        for call in self.e.calls:
            if call.task not in TASKS:
                continue  # (the flow-control tasks' own rows)
            if call.error or call.deduplicated or call.task_id in self.starts:
                continue
            kill = self.lost_by_the_transport(call)
            if freed := self.e.freed.get(call.task_id):
                # Handed to a child killed before the run began: Celery acks an acks_late
                # message as failed when its child dies (no reject_on_worker_lost), and the
                # main process freed the key with it. The record went with its message.
                celerys.append(
                    f"{call.task}[{call.key}] {call.task_id} accepted {self.t(call.start)}: "
                    f"its child killed before the run began, the message acked as failed and "
                    f"the key freed at {self.t(freed[0][0])}; {self.before(freed[0][0])}"
                )
            elif kill is not None:
                transport.append(
                    f"{call.task}[{call.key}] {call.task_id} accepted {self.t(call.start)}: in "
                    f"the queue before the {kill.kind} at {self.t(kill.start)} ({kill.detail}), "
                    "in neither the queue nor kombu's unacked hash after it"
                )
            else:
                where = " (its message still in the broker)" if call.task_id in self.e.held else ""
                ours.append(
                    f"{call.task}[{call.key}] {call.task_id} accepted {self.t(call.start)}, "
                    f"never ran{where}; {self.before(call.start)}{self.failures(call.task_id)}"
                )
        return [
            *_ours_and_kombus(
                "accepted calls that never ran",
                ours,
                "kombu: popped before it was unacked, by a killed worker or at a broker cut (lost)",
                transport,
            ),
            Row(
                "Celery: acked as failed, its child killed before the run began (key freed)",
                len(celerys),
                "not ours" if celerys else "ok",
                celerys,
            ),
        ]

    # -- the side producer: a purge, and a task no worker knows -------------------------------

    def side_rows(self) -> list[Row]:
        """A purged call never runs, and its key is freed by the reaper (the keys left row
        judges that); every accepted call of the purgeable task is purged (no worker consumes
        its queue); a call of the task no worker knows never runs, its key freed by the worker
        that dropped it."""
        purged = frozenset().union(*(f.purged for f in self.e.faults))
        accepted = [c for c in self.e.side_calls if not c.error and not c.deduplicated]
        gone, lost = [], []
        for call in accepted:
            if call.task != PURGEABLE or call.task_id in self.starts:
                continue
            line = f"{call.task}[{call.key}] {call.task_id} accepted {self.t(call.start)}"
            (gone if call.task_id in purged else lost).append(line)
        unknown = [c for c in accepted if c.task == UNKNOWN]
        ran = [c.task_id for c in unknown if c.task_id in self.starts]
        return [
            Row("side: calls made (purgeable, unknown task)", len(self.e.side_calls), "info", []),
            Row("side: accepted calls purged (their keys to the reaper)", len(gone), "info", gone),
            Row(
                "side: accepted purgeable calls not purged that never ran",
                len(lost),
                _fail(lost),
                lost,
            ),
            Row("side: accepted calls of a task no worker knows", len(unknown), "info", []),
            Row("side: a task no worker knows ran", len(ran), _fail(ran), ran),
        ]

    # -- the debounced task ------------------------------------------------------------------

    def debounce_rows(self) -> list[Row]:
        """The debounced task's rows (see docs/chaos.md): one burst at a time per key, no two
        runs of a key at once, each run with its burst's last arguments as far as the design
        promises them, every call's task id run, nothing left of it."""
        return [
            self.debounce_info_row(),
            *self.duplicate_rows(
                (DEBOUNCED,),
                (
                    "debounced: a second burst accepted while the first was queued",
                    "debounced: second bursts inside the restart window (<= 1 per key)",
                    "debounced: keys with more than one second burst inside the window",
                ),
            ),
            self.overlap_row((DEBOUNCED,), "debounced: overlapping runs of one key"),
            *self.argument_rows(),
            *self.burst_never_ran_rows(),
            self.latest_left_row(),
        ]

    def debounce_info_row(self) -> Row:
        """How much the debounced rows saw: calls, bursts, runs, deliveries sent again, and
        runs whose argument was not their message's first (taken from the dedup Redis)."""
        calls = [call for call in self.e.calls if call.task == DEBOUNCED]
        first = {
            call.task_id: call.arg for call in calls if not call.error and not call.deduplicated
        }
        runs = [(task_id, arg) for task_id, ran in self.e.ran.items() for _, arg, _ in ran]
        again = sum(len(self.e.retried.get(task_id, [])) for task_id in self.burst_calls())
        taken = sum(1 for task_id, arg in runs if first.get(task_id, arg) != arg)
        return Row(
            "debounced: calls / bursts / runs",
            len(calls),
            "info",
            [
                f"{len(first)} bursts (accepted calls), {len(runs)} runs, {taken} with a later "
                f"call's argument than their first's, {again} deliveries sent again (early, or "
                "deferred)"
            ],
        )

    def burst_calls(self) -> dict[str, list[Call]]:
        """Task id -> the debounced calls answered with it (or that raised publishing it)."""
        calls: dict[str, list[Call]] = defaultdict(list)
        for call in self.e.calls:
            if call.task == DEBOUNCED and call.task_id:
                calls[call.task_id].append(call)
        return calls

    def delivery_claim(self, task_id: str, at: float, pid: int) -> float:
        """The prerun of the delivery whose body began at ``at`` in process ``pid``: it comes
        just before that delivery's claim (and its take of the latest arguments)."""
        preruns = [t for t, p in self.e.prerun.get(task_id, []) if p == pid and t <= at]
        return max(preruns, default=at)

    def argument_rows(self) -> list[Row]:
        """Each run of a debounced task id ran with an argument of a call made for it, and
        never with an older one than a call for it had left before its claim, but where the
        design says the run has its message's arguments (:meth:`message_arguments_why`);
        and no call is answered with a task id after its last claim (after the body of its
        last run, with no claim since: its arguments could never run)."""
        stale, by_design, foreign = self.run_arguments()
        late, restored = self.late_calls()
        return [
            Row(
                "debounced: runs with older arguments than a call for them left before the claim",
                len(stale),
                _fail(stale),
                [line for _, line in stale],
            ),
            Row(
                "debounced: runs with their message's arguments, by design (below)",
                len(by_design),
                "info",
                [line for _, line in by_design],
            ),
            Row(
                "debounced: runs with an argument no call of their task id made",
                len(foreign),
                _fail(foreign),
                foreign,
            ),
            Row(
                "debounced: calls answered with a task id after its last claim",
                len(late),
                _fail(late),
                late,
            ),
            Row(
                "debounced: calls answered with a running task id restored after a restart",
                len(restored),
                "info",
                restored,
            ),
            self.last_argument_row({task_id for task_id, _ in by_design}),
        ]

    def run_arguments(
        self,
    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[str]]:
        """(stale, by design, foreign): runs with older arguments than a call for their task
        id left before their claim, unexplained and explained ((task id, line) each), and
        runs with an argument no call of their task id made."""
        calls = self.burst_calls()
        unnamed: dict[int, set[int]] = defaultdict(set)  # (calls that raised before an id)
        for call in self.e.calls:
            if call.task == DEBOUNCED and not call.task_id and call.arg is not None:
                unnamed[call.key].add(call.arg)
        stale, by_design, foreign = [], [], []
        for task_id, runs in self.e.ran.items():
            made = calls.get(task_id, [])
            key = made[0].key if made else -1
            claims = self.debounce_claims(task_id)
            made_args = sorted(c.arg for c in made if c.arg is not None)
            for at, arg, pid in runs:
                claim = self.delivery_claim(task_id, at, pid)
                if arg not in made_args and arg not in unnamed[key]:
                    foreign.append(
                        f"debounced[{key}] {task_id} ran {self.t(at)} with {arg}; the calls "
                        f"answered with it made {made_args}; {self.before(claim)}"
                    )
                older = [c for c in made if not c.error and c.end < claim and (c.arg or 0) > arg]
                if not older:
                    continue
                newest = max(older, key=lambda c: c.arg or 0)
                line = (
                    f"debounced[{key}] {task_id} ran {self.t(at)} with {arg} (its delivery's "
                    f"prerun {self.t(claim)}), though the call of {newest.arg} "
                    f"({self.t(newest.start)}-{self.t(newest.end)}) had left it for it; "
                    f"runs {self.history(task_id)}"
                )
                why = self.message_arguments_why(claim, at, older, claims, task_id)
                if why:
                    by_design.append((task_id, f"{line}; {why}"))
                else:
                    stale.append((task_id, f"{line}; {self.before(claim)}"))
        return stale, by_design, foreign

    def late_calls(self) -> tuple[list[str], list[str]]:
        """(late, restored): calls answered with a task id after its last claim, and those
        of them a dedup restart explains (:meth:`restored_while_running`)."""
        late, restored = [], []
        for task_id, made in self.burst_calls().items():
            # A claim is made between its delivery's prerun and its body: a call that began
            # after the body of the last claimed delivery, with no claim after it, reached
            # Redis after that claim for sure.
            bodies = sorted(at for at, _, _ in self.e.ran.get(task_id, []))
            claims = self.debounce_claims(task_id)
            for call in made:
                if call.error or not call.deduplicated or not bodies:
                    continue
                if call.start <= bodies[-1] or any(at > call.start for at in claims):
                    continue
                line = (
                    f"debounced[{call.key}] call of {call.arg} at {self.t(call.start)} "
                    f"answered with {task_id}, whose last run began {self.t(bodies[-1])} "
                    f"(runs {self.history(task_id)})"
                )
                fault = self.restored_while_running(task_id, call.start)
                if fault is not None:
                    restored.append(
                        f"{line}: it ran across the dedup restart at {self.t(fault.start)}, "
                        "and its record came back as its message's (restore.lua: a message "
                        "the broker holds), answering calls until its run ended"
                    )
                else:
                    late.append(f"{line}; {self.before(call.start)}")
        return late, restored

    def restored_while_running(self, task_id: str, at: float) -> Fault | None:
        """The dedup-Redis restart across which ``task_id``'s last run ran (its message,
        unacked, had its record written back into the call key), with ``at`` within the
        restart window after it."""
        spans = sorted(self.spans.get(task_id, []))
        if not spans:
            return None
        start, end = spans[-1]
        for fault in self.e.faults:
            if fault.kind != "dedup restart":
                continue
            running = start <= fault.end and (end is None or end >= fault.start)
            if running and fault.start <= at <= fault.end + self.window:
                return fault
        return None

    def last_argument_row(self, by_design: set[str]) -> Row:
        """Latest wins, for the key: the argument of each key's last call (the largest)
        ran, in some run of the key, but where the last call's task id never ran for a
        named transport fault, or its run had its message's arguments by design."""
        by_key: dict[int, list[Call]] = defaultdict(list)
        for call in self.e.calls:
            if call.task == DEBOUNCED and not call.error and call.arg is not None:
                by_key[call.key].append(call)
        ran: dict[int, list[int]] = defaultdict(list)
        for task_id, runs in self.e.ran.items():
            made = self.burst_calls().get(task_id)
            if made:
                ran[made[0].key].extend(arg for _, arg, _ in runs)
        ours, explained = [], []
        for key, calls in sorted(by_key.items()):
            last = max(calls, key=lambda call: call.arg or 0)
            if any(arg >= (last.arg or 0) for arg in ran.get(key, [])):
                continue
            line = (
                f"debounced[{key}] last call of {last.arg} at {self.t(last.start)} answered "
                f"with {last.task_id} (runs {self.history(last.task_id) or 'none'}); the key's "
                f"runs had at most {max(ran.get(key, [0]))}"
            )
            if last.task_id in by_design:
                explained.append(f"{line}: its run had its message's, by design (above)")
            elif last.task_id not in self.starts and (
                self.lost_message(last.task_id) or self.e.freed.get(last.task_id)
            ):
                explained.append(f"{line}: it never ran (kombu's loss or Celery's ack, above)")
            else:
                ours.append(f"{line}; {self.before(last.start)}")
        verdict = "FAIL" if ours else ("info" if explained else "ok")
        return Row(
            "debounced: keys whose last call's argument never ran",
            len(ours) + len(explained),
            verdict,
            ours + explained,
        )

    def message_arguments_why(
        self, claim: float, body: float, older: list[Call], claims: list[float], task_id: str = ""
    ) -> str:
        """Why a run whose delivery claimed at ``claim`` (its body began at ``body``) had its
        message's arguments rather than the latest that ``older`` calls left: what the design
        says, or "" (none: a failure). The message carries those of its call (or of the early
        delivery that sent it again). A take moves what it takes to the hash's field
        ``taken``, which answers the same task id's take again (its reply lost, or its
        message delivered again) until another task id's run takes."""
        first = min(call.start for call in older)
        earlier = [at for at in claims if first < at < claim]
        if earlier:
            since = self.other_take(older[0].key, task_id, min(earlier), claim)
            if since:
                return (
                    f"an earlier delivery of it claimed at {self.t(min(earlier))} and took "
                    f"them, and {since} took since (the hash keeps the last take only): this "
                    "delivery is its message again (its run killed, or its ack lost), with the "
                    "arguments it was sent with"
                )
        for at, _, action in self.e.unavailable.get(task_id, []):
            if claim <= at <= body:
                return f"the dedup Redis could not be asked at {self.t(at)}: it {action}"
        # (The take is made between the prerun and the body: a restart up to the body may
        # come before it.)
        for fault in self.e.faults:
            if fault.kind == "dedup restart" and fault.start <= body and fault.end >= first:
                return (
                    f"the dedup Redis restart at {self.t(fault.start)} lost them (and the "
                    "record): the run has its message's"
                )
        return ""

    def other_take(self, key: int, task_id: str, after: float, before: float) -> str:
        """Another task id of the debounced ``key`` whose run took arguments between
        ``after`` and ``before``: a claim of it then, and a duplicate answered with it
        (which left the arguments its claim took). "" if none."""
        for other, made in self.burst_calls().items():
            if other == task_id or made[0].key != key:
                continue
            if not any(call.deduplicated and not call.error for call in made):
                continue
            took = [at for at in self.debounce_claims(other) if after < at < before]
            if took:
                return f"{other}'s run (claimed {self.t(took[0])})"
        return ""

    def burst_never_ran_rows(self) -> list[Row]:
        """Every debounced call's task id ran, but for a message kombu lost or one Celery
        acked as failed (its child killed before the run began), shown apart."""
        ours, transport, celerys = [], [], []
        for task_id, made in self.burst_calls().items():
            answered = [call for call in made if not call.error]
            if not answered or task_id in self.starts:
                continue
            first = min(answered, key=lambda call: call.start)
            line = (
                f"debounced[{first.key}] {task_id}: {len(answered)} calls answered with it "
                f"({self.t(first.start)}-{self.t(max(c.end for c in answered))}, arguments "
                f"{sorted(c.arg or 0 for c in answered)}) and it never ran"
            )
            kill = self.lost_message(task_id)
            if freed := self.e.freed.get(task_id):
                celerys.append(
                    f"{line}: its child killed before the run began, the message acked as "
                    f"failed and the key freed at {self.t(freed[0][0])}; "
                    f"{self.before(freed[0][0])}"
                )
            elif kill is not None:
                transport.append(
                    f"{line}: its message was in the queue before the {kill.kind} at "
                    f"{self.t(kill.start)} ({kill.detail}), in neither the queue nor kombu's "
                    "unacked hash after it"
                )
            else:
                where = " (its message still in the broker)" if task_id in self.e.held else ""
                deliveries = len(self.e.prerun.get(task_id, []))
                ours.append(
                    f"{line}{where}; {deliveries} deliveries, "
                    f"{len(self.e.retried.get(task_id, []))} sent again; "
                    f"{self.before(first.start)}{self.failures(task_id)}"
                )
        return [
            *_ours_and_kombus(
                "debounced: calls whose task id never ran",
                ours,
                "debounced: kombu lost the message (popped before it was unacked)",
                transport,
            ),
            Row(
                "debounced: Celery acked as failed, its child killed before the run (key freed)",
                len(celerys),
                "not ours" if celerys else "ok",
                celerys,
            ),
        ]

    def latest_left_row(self) -> Row:
        """Latest arguments left after the drain (they hold no key: a new call opens a new
        burst). A task id that ran took its own as its run claimed: a field of one that ran is
        a failure; one of a task id that never ran lives out its ttl (the rows above judge
        why it never ran)."""
        ours, left, kept = [], [], []
        for line in self.e.keys_left:
            if LATEST_LEFT not in line:
                continue
            if line.endswith(TAKEN):
                kept.append(f"{line}: the last take, kept to answer it again")
                continue
            owner = line.rsplit(" ", 1)[1]
            if owner in self.starts:
                ours.append(f"{line}; it ran {self.history(owner)}")
            else:
                left.append(f"{line}; it never ran")
        verdict = "FAIL" if ours else ("info" if left or kept else "ok")
        return Row(
            "debounced: latest arguments left after the drain",
            len(ours) + len(left),
            verdict,
            ours + left + kept,
        )

    # -- the limited tasks ---------------------------------------------------------------------

    def limit_rows(self) -> list[Row]:
        """The limited tasks' rows (see docs/chaos.md): never more runs of a key at once than
        its task's ``key_concurrency`` (CONCURRENCY: ``limited``, ``paced``), never more
        starts of a key in a period than its ``key_rate_limit`` (RATES: ``rated``,
        ``paced``), every call run, nothing left that holds later calls back."""
        calls = Counter(call.task for call in self.e.calls if call.task in FLOW)
        runs = {
            task: sum(len(runs) for (name, _), runs in self.e.runs.items() if name == task)
            for task in FLOW
        }
        again = {
            task: sum(
                len(self.e.retried.get(call.task_id, []))
                for call in self.e.calls
                if call.task == task
            )
            for task in FLOW
        }
        return [
            Row(
                f"{FLOW_ROWS}: calls",
                sum(calls.values()),
                "info",
                [
                    f"{task}: {calls[task]} calls, {runs[task]} runs, {again[task]} deliveries "
                    "sent again to wait their turn"
                    for task in FLOW
                ],
            ),
            *self.concurrency_rows(),
            *self.rate_rows(),
            *self.limited_never_ran_rows(),
            *self.limits_left_rows(),
        ]

    def unlimited(self, task_id: str, start: float) -> bool:
        """The delivery of ``task_id`` whose body began at ``start`` ran without its limit:
        the dedup Redis could not be asked (by design: a consumed message runs)."""
        return any(
            start - 5.0 <= at <= start and "without its limit" in action
            for at, _, action in self.e.unavailable.get(task_id, [])
        )

    def restart_before(self, at: float) -> Fault | None:
        """The last dedup-Redis restart that began before ``at``."""
        restarts = [f for f in self.e.faults if f.kind == "dedup restart" and f.start <= at]
        return restarts[-1] if restarts else None

    def concurrency_rows(self) -> list[Row]:
        """The concurrency rows of each task with ``key_concurrency`` (CONCURRENCY)."""
        return [row for task, limit in CONCURRENCY.items() for row in self.at_once(task, limit)]

    def at_once(self, task: str, limit: int) -> list[Row]:
        """At most ``limit`` runs of one key of ``task`` at once (a killed run ends at its
        kill). More, up to twice the limit, only just after a dedup-Redis restart and with a
        run that began before it among them: the restart lost the slots, and the live runs'
        heartbeats count theirs again at their next renewal (docs/flow-control.md)."""
        ours, restart = [], []
        for (name, key), runs in sorted(self.e.runs.items()):
            if name != task:
                continue
            live: list[tuple[str, float, float | None]] = []
            for run in sorted(runs, key=lambda run: run[1]):
                task_id, start, _ = run
                if self.unlimited(task_id, start):
                    continue
                live = [r for r in live if r[2] is None or r[2] > start] + [run]
                if len(live) <= limit:
                    continue
                line = f"{task}[{key}] {len(live)} runs at {self.t(start)}: " + ", ".join(
                    f"{r[0]} {self.t(r[1])}-{self.t(r[2]) if r[2] else '?'}" for r in live
                )
                fault = self.restart_before(start)
                if (
                    fault is not None
                    and len(live) <= 2 * limit
                    # A slot is taken before the body begins (see in_a_period).
                    and any(
                        self.delivery_claim(r[0], r[1], self._pid_of(r[0], r[1])) < fault.start
                        for r in live
                    )
                ):
                    restart.append(f"{line}; after the dedup restart at {self.t(fault.start)}")
                else:
                    ours.append(f"{line}; {self.before(start)}")
        runs = "run" if limit == 1 else "runs"
        return [
            Row(
                f"{task}: more than {limit} {runs} of one key at once",
                len(ours),
                _fail(ours),
                ours,
            ),
            Row(
                f"{task}: up to {2 * limit} at once across a dedup restart (slots lost)",
                len(restart),
                "info",
                restart,
            ),
        ]

    def rate_rows(self) -> list[Row]:
        """The rate rows of each task with ``key_rate_limit`` (RATES)."""
        return [row for task, rate in RATES.items() for row in self.in_a_period(task, rate)]

    def in_a_period(self, task: str, rate: int) -> list[Row]:
        """At most ``rate`` starts of one key of ``task`` in any PERIOD. A start is made in
        Redis between its delivery's prerun and its body's start: ``rate`` + 1 starts whose
        bodies all began within a period of the earliest of their preruns broke the limit for
        sure. Up to twice the rate only across a dedup-Redis restart (the starts made were
        lost)."""
        ours, restart = [], []
        for (name, key), runs in sorted(self.e.runs.items()):
            if name != task:
                continue
            starts = sorted(
                (start, self.delivery_claim(task_id, start, self._pid_of(task_id, start)), task_id)
                for task_id, start, _ in runs
                if not self.unlimited(task_id, start)
            )
            for index in range(len(starts) - rate):
                window = starts[index : index + rate + 1]
                first = min(prerun for _, prerun, _ in window)
                last = window[-1][0]
                if last - first >= PERIOD:
                    continue
                inside = [s for s in starts if first <= s[0] and s[0] - first < PERIOD]
                line = (
                    f"{task}[{key}] {len(inside)} starts within {last - first:.3f}s from "
                    f"{self.t(first)}: "
                    + ", ".join(f"{task_id} {self.t(start)}" for start, _, task_id in inside)
                )
                fault = self.restart_before(last)
                if (
                    fault is not None
                    and len(inside) <= 2 * rate
                    and first <= fault.end
                    # A start is made in Redis before its body begins: one whose prerun came
                    # before the restart may have been made before it, and lost with it.
                    and any(prerun < fault.start for _, prerun, _ in inside)
                ):
                    restart.append(f"{line}; across the dedup restart at {self.t(fault.start)}")
                else:
                    ours.append(f"{line}; {self.before(first)}")
        return [
            Row(
                f"{task}: more than {rate} starts of one key in {PERIOD:g}s",
                len(ours),
                _fail(ours),
                ours,
            ),
            Row(
                f"{task}: up to {2 * rate} in {PERIOD:g}s across a dedup restart (starts lost)",
                len(restart),
                "info",
                restart,
            ),
        ]

    def _pid_of(self, task_id: str, start: float) -> int:
        """The pid of the run of ``task_id`` whose body began at ``start`` (-1: unknown)."""
        return self.run_pids.get((task_id, start), -1)

    def limited_never_ran_rows(self) -> list[Row]:
        """Every call of a limited task ran (each has a task id of its own), but for a
        message kombu lost or one Celery acked as failed as its child died before the run
        began (shown apart)."""
        ours, transport, celerys = [], [], []
        for call in self.e.calls:
            if call.task not in FLOW or call.error or call.task_id in self.starts:
                continue
            line = f"{call.task}[{call.key}] {call.task_id} called {self.t(call.start)}, never ran"
            kill = self.lost_message(call.task_id)
            if lost := self.e.worker_lost.get(call.task_id):
                celerys.append(
                    f"{line}: its child died before the run began and Celery acked it as "
                    f"failed (WorkerLostError) at {self.t(lost[0][0])}; {self.before(lost[0][0])}"
                )
            elif kill is not None:
                transport.append(
                    f"{line}: in the queue before the {kill.kind} at {self.t(kill.start)} "
                    f"({kill.detail}), in neither the queue nor kombu's unacked hash after it"
                )
            else:
                where = " (its message still in the broker)" if call.task_id in self.e.held else ""
                ours.append(
                    f"{line}{where}; {len(self.e.prerun.get(call.task_id, []))} deliveries, "
                    f"{len(self.e.retried.get(call.task_id, []))} sent again; "
                    f"{self.before(call.start)}{self.failures(call.task_id)}"
                )
        return [
            *_ours_and_kombus(
                f"{FLOW_ROWS}: calls that never ran",
                ours,
                f"{FLOW_ROWS}: kombu lost the message (popped before it was unacked)",
                transport,
            ),
            Row(
                f"{FLOW_ROWS}: Celery acked as failed, its child killed before the run",
                len(celerys),
                "not ours" if celerys else "ok",
                celerys,
            ),
        ]

    def limits_left_rows(self) -> list[Row]:
        """What the limits left after the drain. Stuck (a failure): a place in a line (it
        holds every later call of its key back until it lapses) but for a task id whose
        message kombu lost or Celery acked as failed (documented: it lapses); a slot whose
        lease still runs though its task id's runs all ended by themselves (its end did not
        free it). Shown: a slot of a killed run (its lease frees it), a lease over (free),
        the rate's log of starts and reservations (forgotten a period on)."""
        excused = {
            call.task_id
            for call in self.e.calls
            if call.task in FLOW
            and (self.lost_message(call.task_id) or self.e.worker_lost.get(call.task_id))
        }
        # Task ids whose last run was killed (it ends at its kill): its slot frees with
        # its lease.
        last: dict[str, float | None] = {}
        for task_id, spans in self.spans.items():
            if spans:  # (a defaultdict: a task id only asked about has none)
                last[task_id] = max(spans)[1]
        killed = {
            task_id
            for task_id, end in last.items()
            if end is not None and end not in self.e.completed.get(task_id, [])
        }
        stuck, shown = [], []
        for line in self.e.keys_left:
            suffix = _limit_key(line)
            if not suffix:
                continue
            member = line.split(" member ", 1)[1].split(" ")[0] if " member " in line else ""
            if suffix == ":line" and member and member not in excused:
                stuck.append(f"{line}: a place left; {self.history(member) or 'never ran'}")
            elif suffix == ":slots" and member and " lease over" not in line:
                if member in killed or member in excused:
                    shown.append(f"{line}: its run was killed, the lease frees it")
                else:
                    stuck.append(f"{line}: held after its runs ended: {self.history(member)}")
            else:
                shown.append(line)
        return [
            Row(
                f"{FLOW_ROWS}: places or slots stuck after the drain",
                len(stuck),
                _fail(stuck),
                stuck,
            ),
            Row(
                f"{FLOW_ROWS}: their keys left (free by their ttl)",
                len(shown),
                "info" if shown else "ok",
                shown,
            ),
        ]

    def error_row(self, errors: Counter[str]) -> Row:
        """Calls that raised (the broker cut); any whose message ran anyway, by its id."""
        lines = [f"{name}: {count}" for name, count in errors.items()]
        for call in self.e.calls:
            if call.error and call.task_id and call.task_id in self.starts:
                lines.append(
                    f"{call.task}[{call.key}] {call.task_id} raised {call.error} at "
                    f"{self.t(call.end)} but ran {self.history(call.task_id)}"
                )
        return Row(
            "calls that raised (broker cut, soft time limit)", sum(errors.values()), "info", lines
        )

    def warning_row(self) -> Row:
        """Each warning, with the call it was logged in (a producer makes one call at a time)
        and whether the task id it names ever ran."""
        lines = []
        for warning in self.e.warnings:
            at, pid, text = warning.split(" ", 2)
            during = next(
                (
                    call
                    for call in self.e.calls
                    if call.pid == int(pid) and call.start <= float(at) <= call.end
                ),
                None,
            )
            named = _task_id_in(text)
            outcome = (
                "no call"
                if during is None
                else f"logged in a {during.task}[{during.key}] call that "
                + (f"raised {during.error}" if during.error else f"returned {during.task_id}")
                + f" at {self.t(during.end)}"
            )
            ran = self.history(named) or "never ran"
            lines.append(
                f"{self.t(float(at))} pid {pid} {text}; {outcome}; {named}: {ran}; "
                f"{self.before(float(at))}"
            )
        return Row("library warnings in the producers", len(lines), "info", lines)

    def rerun_row(self) -> Row:
        lines = []
        for task_id in self.e.completed:
            freed = self.acked_lost(task_id)
            if freed is None:
                continue
            later = sorted(at for at in self.starts[task_id] if at > freed)
            if not later:
                continue
            lines.append(
                f"{task_id} lost, acked as failed and its key freed {self.t(freed)}, "
                f"ran again {', '.join(map(self.t, later))}; {self.before(later[0])}"
            )
        for task_id, ends in self.e.completed.items():
            later = [at for at in self.starts[task_id] if at > min(ends)]
            if later:
                lines.append(
                    f"{task_id} completed {self.t(min(ends))}, ran again "
                    f"{', '.join(map(self.t, sorted(later)))}; {self.before(min(later))}"
                )
        return Row(
            "runs again after a completed or failed run (redelivered: ack lost)",
            len(lines),
            "info",
            lines,
        )

    def rows(self) -> list[Row]:
        calls = self.e.calls
        accepted = sum(1 for call in calls if not call.error and not call.deduplicated)
        errors = Counter(call.error for call in calls if call.error)
        runs = sum(len(runs) for runs in self.e.runs.values())
        stalls = [f for f in self.e.faults if f.kind == "stall"]
        kombu_stalls = [f"{self.t(f.start)} {f.detail}" for f in stalls if "kombu" in f.detail]
        other_stalls = [f"{self.t(f.start)} {f.detail}" for f in stalls if "kombu" not in f.detail]
        return [
            Row(
                "calls made / accepted / deduplicated",
                len(calls),
                "info",
                [
                    f"{accepted} accepted, {len(calls) - accepted - sum(errors.values())} "
                    f"deduplicated ({sum(call.remembered for call in calls)} answered from "
                    f"memory), {runs} runs"
                ],
            ),
            self.error_row(errors),
            Row(
                "published without dedup (dedup Redis unreachable; policy 'enqueue')",
                len(unrecorded := self.unrecorded()),
                "info",
                [
                    f"{call.task}[{call.key}] {call.task_id} at {self.t(call.start)}: "
                    f"{self.history(call.task_id) or 'never ran'}"
                    for call in calls
                    if call.task_id in unrecorded
                ],
            ),
            Row(
                "faults injected",
                len(self.e.faults) - len(stalls),
                "info",
                [
                    f"{self.t(f.start)} {f.kind} ({f.detail})"
                    for f in self.e.faults
                    if f.kind != "stall"
                ],
            ),
            *self.duplicate_rows(),
            self.wrong_holder_row(),
            self.overlap_row(),
            self.rerun_row(),
            self.deferral_row(),
            self.warning_row(),
            *self.keys_left_rows(),
            self.no_ttl_row(),
            *self.lost_rows(),
            *self.never_ran_rows(),
            *self.side_rows(),
            *self.debounce_rows(),
            *self.limit_rows(),
            Row(
                "kombu: worker stopped consuming after failed acks (restarted)",
                len(kombu_stalls),
                "not ours" if kombu_stalls else "ok",
                kombu_stalls,
            ),
            Row(
                "worker stalled otherwise (restarted)",
                len(other_stalls),
                _fail(other_stalls),
                other_stalls,
            ),
        ]


#: The form of a latest-arguments field in the keys left (tests/chaos/run.py); ending in
#: TAKEN, the hash's field of the last take (take_latest.lua).
LATEST_LEFT = " latest arguments of "
TAKEN = " (taken)"
#: The form of a run's tombstone in the keys left (end_latest.lua): it holds no key, and
#: lives for its message's redelivery horizon by design.
ENDED_LEFT = " ended run of "


def _limit_key(line: str) -> str:
    """The limit key's suffix (``:slots``, ``:line``, ...) of a line of the keys left whose
    key is one (``<prefix>:{<task>:<digest>}:<suffix> ...``), else ""."""
    name = line.split(" ", 1)[0]
    tail = name.rsplit("}", 1)[-1] if "}" in name else ""
    return tail if tail in LIMIT_SUFFIXES else ""


def _fail(found: Iterable[Any]) -> str:
    return "FAIL" if list(found) else "ok"


def table(title: str, rows: list[Row], details: int = 12) -> str:
    """One table; under it, up to ``details`` lines for each row that is not ok."""
    width = max(len(row.check) for row in rows)
    lines = [title, f"{'check'.ljust(width)}  {'count':>6}  verdict", "-" * (width + 18)]
    lines.extend(f"{row.check.ljust(width)}  {row.count:>6}  {row.verdict}" for row in rows)
    for row in rows:
        if row.verdict == "ok" or not row.details:
            continue
        lines.append(f"\n{row.check}:")
        lines.extend(f"  {line}" for line in row.details[:details])
        if len(row.details) > details:
            lines.append(f"  ... {len(row.details) - details} more")
    return "\n".join(lines)


def failed(rows: list[Row]) -> bool:
    return any(row.verdict == "FAIL" for row in rows)


def _task_id_in(text: str) -> str:
    """The task id a library warning names: ``... task.name[<id>] ...`` (else "")."""
    match = re.search(r"\[([0-9a-f-]{36})\]", text)
    return match.group(1) if match else ""
