"""The store: every read and write celery-dedupe makes to the dedup Redis, one Lua script per
state transition and one round trip per call.

Scripts live in ``dedupe/store/lua/`` (each headed by its KEYS, ARGV and replies), are
registered once on the store's client and run through a script runner
(:class:`~dedupe.store.runner.ScriptCalls`: one server's or a Cluster's), EVALSHA with a
NOSCRIPT fallback, on a connection of each thread's own. Their replies are read by
:mod:`dedupe.store.replies`; redis-py's errors are sorted by :mod:`dedupe.store.redis_errors`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol, TypeVar

import redis.cluster
from redis.commands.core import Script

from dedupe.errors import RedisCommandError, UnexpectedReply
from dedupe.values import defaults
from dedupe.values.keys import CallKeys
from dedupe.values.latest import Latest, LatestWrite
from dedupe.values.record import Holder, pack_owner, pack_queued, pack_restored

from .clients import DedupRedis
from .cluster_runner import ClusterScriptRunner
from .green_pool import script_runner
from .redis_errors import reraise_unavailable
from .replies import (
    Push,
    Renewal,
    Requeue,
    Restore,
    Take,
    Wait,
    first_holder,
    not_decided,
    read_cancel,
    read_claim,
    read_confirm,
    read_enqueue,
    read_publish,
    read_release,
    read_renew,
    read_requeue,
    read_restore,
    read_take,
    read_wait,
    run_id_of,
)
from .runner import ScriptCalls
from .script_runner import Reply

__all__ = [
    "DataLossBarrier",
    "EnqueueCall",
    "EtaSplit",
    "LatestCall",
    "Lease",
    "PendingPush",
    "PlaceWait",
    "Restoration",
    "StartPush",
    "Store",
    "script_text",
    "slot_member",
]

_T = TypeVar("_T")


def script_text(name: str) -> str:
    """A script's source: the shared prelude, then the script."""
    package = resources.files("dedupe.store") / "lua"
    prelude = (package / "_prelude.lua").read_text(encoding="utf-8")
    return prelude + "\n" + (package / f"{name}.lua").read_text(encoding="utf-8")


@dataclass(frozen=True, slots=True)
class EtaSplit:
    """A message serialised as kombu pushes it, but for its eta's JSON value: the text
    before it and after it, and the call's own eta's value (``null``: none)."""

    prefix: str
    own: str
    suffix: str


@dataclass(frozen=True, slots=True)
class PlaceWait:
    """How long the place in line of a call with both limits waits: ``past_start_ms`` past
    its start, cut at its message's expiry (``expiry_ms`` from now, 1 s at least; None: the
    message never expires)."""

    past_start_ms: int
    expiry_ms: int | None = None

    def ms_after(self, wait_ms: int) -> int:
        """How long the place waits, for a start ``wait_ms`` from now (as the script has it)."""
        place = self.past_start_ms + wait_ms
        return place if self.expiry_ms is None else max(min(place, self.expiry_ms), 1000)


@dataclass(frozen=True, slots=True)
class StartPush:
    """What start_publish.lua did: the ms from now to the call's start, and the JSON value
    of the eta it pushed."""

    wait_ms: int
    eta: str


@dataclass(frozen=True, slots=True)
class Lease:
    """A run's hold on its run key, as the heartbeat renews it."""

    key: str
    task_id: str
    token: str
    lease_ms: int
    #: The running record, to re-create the key if Redis lost it.
    record: bytes
    #: How long the record lives past each renewal: the redelivery horizon of a run whose
    #: message the broker would deliver again if it died; 0 (the lease) for any other run.
    record_ttl_ms: int = 0
    #: The call's record key when it is not the run key (``unique_until="started"``).
    call_key: str = ""
    #: A slot of a key with ``key_concurrency`` (``key``: its slots; renew_slot.lua), not a
    #: key's record (renew.lua).
    slot: bool = False

    @property
    def keys(self) -> list[str]:
        """renew.lua's (or renew_slot.lua's) KEYS."""
        return [self.key, self.call_key] if self.call_key else [self.key]

    def args(self) -> list[Any]:
        """renew.lua's (or renew_slot.lua's) ARGV."""
        if self.slot:
            return [slot_member(self.task_id, self.token), self.lease_ms]
        return [
            pack_owner(self.task_id),
            self.token,
            self.lease_ms,
            self.record,
            self.record_ttl_ms,
        ]


@dataclass(frozen=True, slots=True)
class Restoration:
    """The record of one message the broker holds for a worker, to write back."""

    keys: CallKeys
    task_id: str
    #: :func:`dedupe.values.record.pack_restored`'s record; the queued record, to wait in a run.
    record: bytes
    queued: bytes
    ttl_ms: int
    lease_ms: int

    @classmethod
    def of(
        cls,
        keys: CallKeys,
        task_id: str,
        delivered_at: float,
        ttl_ms: int,
        lease_ms: int,
        eta: float | None = None,
    ) -> Restoration:
        """The restoration of the message of ``task_id`` delivered at ``delivered_at``: its
        restored record and its queued record, both of that moment (withdraw.lua tells what
        restore.lua wrote by these bytes)."""
        record = pack_restored(task_id, delivered_at)
        queued = pack_queued(task_id, delivered_at, eta)
        return cls(keys, task_id, record, queued, ttl_ms, lease_ms)

    def args(self) -> list[Any]:
        """restore.lua's ARGV."""
        return [pack_owner(self.task_id), self.record, self.queued, self.ttl_ms, self.lease_ms]

    def run_lock_args(self) -> list[Any]:
        """restore_run_lock.lua's ARGV."""
        return [self.record, self.ttl_ms, self.lease_ms]


class DataLossBarrier(Protocol):
    """Keeps calls from being decided on a store that lost its data (a restart without
    persistence, a failover to a replica without it, a FLUSHALL) until the records of the
    messages in flight are back: an absent key may be a lost record, whose message a new
    call would duplicate. ``dedupe.recovery.unacked.RestartWatch`` is the one there is."""

    #: The key whose absence says the data was lost (and not restored yet).
    marker: str

    def armed(self) -> bool:
        """Ask with the marker now? (Not for a while after a restore that failed.)"""

    def restore(self) -> None:
        """Restore the records, then set the marker (once per process at a time). Never
        raises: a failure is logged, and disarms the barrier for a while."""


class Store:
    """Every read and write celery-dedupe makes to Redis."""

    #: Set by the runtime where lost records can be restored (a Redis broker with a dedup
    #: Redis of its own): every enqueue then asks with its marker.
    barrier: DataLossBarrier | None = None

    def __init__(
        self,
        client: DedupRedis,
        *,
        busy_poll: float = defaults.BUSY_POLL_US / 1e6,
        budget: float = defaults.CALL_BUDGET,
        remember_duplicates: float = 0.0,
    ) -> None:
        """``remember_duplicates``: the longest a thread answers a repeated duplicate from
        memory (:meth:`remembered`; 0: never; one server only, not a Cluster)."""
        self.client = client
        self._run: ScriptCalls
        if isinstance(client, redis.cluster.RedisCluster):
            self._run = ClusterScriptRunner(client, busy_poll, budget)
        else:
            self._run = script_runner(client, busy_poll, budget, remember_for=remember_duplicates)
        self._enqueue = self._register("enqueue")
        self._enqueue_many = self._register("enqueue_many")
        self._claim = self._register("claim")
        self._renew = self._register("renew")
        self._requeue = self._register("requeue")
        self._wait = self._register("wait")
        self._restore = self._register("restore")
        self._restore_run_lock = self._register("restore_run_lock")
        self._release = self._register("release")
        self._cancel = self._register("cancel")
        self._withdraw = self._register("withdraw")
        self._publish = self._register("publish")
        self._confirm = self._register("confirm")
        self._enqueue_latest = self._register("enqueue_latest")
        self._enqueue_latest_many = self._register("enqueue_latest_many")
        self._publish_latest = self._register("publish_latest")
        self._take_latest = self._register("take_latest")
        self._end_latest = self._register("end_latest")
        self._ticket = self._register("ticket")
        self._ticket_publish = self._register("ticket_publish")
        self._slot = self._register("slot")
        self._slot_start = self._register("slot_start")
        self._renew_slot = self._register("renew_slot")
        self._free_slot = self._register("free_slot")
        self._start = self._register("start")
        self._start_publish = self._register("start_publish")
        self._start_ticket_publish = self._register("start_ticket_publish")
        self._leave_line = self._register("leave_line")
        self._free_slots_of = self._register("free_slots_of")

    def _register(self, name: str) -> Script:
        script: Script = self.client.register_script(script_text(name))
        return script

    @property
    def server(self) -> Mapping[str, Any] | None:
        """The connection settings of the store's one server (host, port, db or path); None
        for a Redis Cluster, whose keys are spread over many."""
        if isinstance(self.client, redis.cluster.RedisCluster):
            return None
        settings: Mapping[str, Any] = self.client.connection_pool.connection_kwargs
        return settings

    def _barrier(self) -> DataLossBarrier | None:
        barrier = self.barrier
        return barrier if barrier is not None and barrier.armed() else None

    def _restore_lost(self, barrier: DataLossBarrier | None) -> None:
        # (The restore never raises: it logs its failures, and the call is decided anyway.)
        assert barrier is not None
        barrier.restore()

    def enqueue(
        self, keys: CallKeys, record: bytes, ttl_ms: int, *, remember: bool = False
    ) -> Holder | None:
        """Create the queued record of a call. None: accepted; a Holder: a duplicate of it.
        ``remember``: a duplicate's holder becomes this thread's answer for the key until
        Redis says the key changed (:meth:`remembered`), from the key's second duplicate
        within ``remember_duplicates`` on (Redis tracks only keys met held before)."""
        barrier = self._barrier()
        marked = [keys.call, barrier.marker] if barrier else [keys.call]
        run = self._run
        with reraise_unavailable("enqueue", keys.call):
            if remember and run.worth_tracking(keys.call):
                reply, tracked_at = run.call_tracked(self._enqueue, marked, [record, ttl_ms])
                if tracked_at is not None and isinstance(reply, bytes):
                    return self._remember(keys.call, reply, tracked_at)
            else:
                reply = run(self._enqueue, marked, [record, ttl_ms])
                if remember and isinstance(reply, bytes):
                    run.note_duplicate(keys.call)  # the next duplicate is tracked
        if not_decided(reply):
            self._restore_lost(barrier)
            with reraise_unavailable("enqueue", keys.call):
                reply = self._run(self._enqueue, [keys.call], [record, ttl_ms])
        return read_enqueue(keys.call, reply)

    def enqueue_latest(
        self, keys: CallKeys, record: bytes, ttl_ms: int, latest: LatestWrite
    ) -> Holder | None:
        """:meth:`enqueue` for a debounced or replacing call: a duplicate of a holder that
        has not started leaves ``latest`` (its arguments and, debounced, the burst's new
        deadline) for its run. One round trip; never remembered (each duplicate has
        arguments to leave)."""
        barrier = self._barrier()
        marked = [keys.call, keys.latest]
        if barrier:
            marked.append(barrier.marker)
        argv = [record, ttl_ms, *latest.argv()]
        with reraise_unavailable("enqueue", keys.call):
            reply = self._run(self._enqueue_latest, marked, argv)
        if not_decided(reply):
            self._restore_lost(barrier)
            with reraise_unavailable("enqueue", keys.call):
                reply = self._run(self._enqueue_latest, marked[:2], argv)
        return read_enqueue(keys.call, reply)

    def take_latest(
        self, keys: CallKeys, task_id: str, retries: int, now: float = 0.0
    ) -> Latest | Take | None:
        """The arguments the duplicates of ``task_id``'s call left for its run, taken
        (None: none left). ``now``: only look, and say whether the deadline passed.
        :attr:`Take.ENDED`: the run of this task id and ``retries`` ended already
        (:meth:`send_end_latest`), and nothing is taken."""
        argv = [pack_owner(task_id), repr(now), retries]
        with reraise_unavailable("take_latest", keys.call):
            reply = self._run(self._take_latest, [keys.latest, keys.ran], argv)
        return read_take(reply)

    def send_end_latest(self, keys: CallKeys, task_id: str, retries: int, horizon_ms: int) -> None:
        """The end of a debounced or replacing run that claimed its key: drop the take kept
        for a resend (and the hash, if that was all), and leave the run's tombstone for
        ``horizon_ms`` (a delivery of the same task id and ``retries`` then does not run),
        without waiting for the reply."""
        argv = [pack_owner(task_id), retries, horizon_ms]
        with reraise_unavailable("end_latest", keys.call):
            self._run.send(self._end_latest, [keys.latest, keys.ran], argv)

    def _remember(self, key: str, reply: bytes, tracked_at: float) -> Holder:
        holder = read_enqueue(key, reply)
        assert holder is not None
        if holder.ttl is not None and not holder.provisional:
            # (A provisional holder is a publish in flight: its answer changes in a moment.)
            expires_at = tracked_at + holder.ttl
            self._run.remember(key, expires_at, (expires_at, holder))
        return holder

    def remembered(self, keys: CallKeys) -> Holder | None:
        """The holder of a call's key as this thread last heard it from an enqueue made with
        ``remember``, if Redis has said nothing of the key since (no round trip); else None."""
        entry = self._run.remembered(keys.call)
        if entry is None:
            return None
        expires_at, holder = entry
        remembered: Holder = dataclasses.replace(
            holder, ttl=max(expires_at - time.monotonic(), 0.0)
        )
        return remembered

    def enqueue_many(self, calls: Sequence[EnqueueCall]) -> list[Holder | None]:
        """:meth:`enqueue` for many calls in one round trip; the answers in order. On one
        server, ``enqueue_many.lua`` decides up to ``_ENQUEUE_CHUNK`` calls per script (half
        the cost of a script per call); on a Cluster each call goes to its own slot's master."""
        return self._enqueue_all(
            calls, self._enqueue, self._enqueue_many, _enqueue_call, _enqueue_many_call
        )

    def enqueue_latest_many(self, calls: Sequence[LatestCall]) -> list[Holder | None]:
        """:meth:`enqueue_latest` for many calls in one round trip, decided in order (a
        later call of a key leaves its arguments for the earlier call's run); the answers in
        order. Chunked as :meth:`enqueue_many` (``enqueue_latest_many.lua``)."""
        return self._enqueue_all(
            calls,
            self._enqueue_latest,
            self._enqueue_latest_many,
            _enqueue_latest_call,
            _enqueue_latest_many_call,
        )

    def _enqueue_all(
        self,
        calls: Sequence[_Call],
        single: Script,
        many: Script,
        one: Callable[[_Call], tuple[list[Any], list[Any]]],
        chunk_of: Callable[[Sequence[_Call], str | None], tuple[list[Any], list[Any]]],
    ) -> list[Holder | None]:
        key = calls[0][0].call if calls else None
        with reraise_unavailable("enqueue", key):
            if self._run.spans_calls:
                replies = self._enqueue_chunks(calls, many, chunk_of)
            else:
                replies = self._run.call_many(single, [one(call) for call in calls])
            _raise_first_error(replies)
        return [
            read_enqueue(call[0].call, reply) for call, reply in zip(calls, replies, strict=True)
        ]

    def _enqueue_chunks(
        self,
        calls: Sequence[_Call],
        many: Script,
        chunk_of: Callable[[Sequence[_Call], str | None], tuple[list[Any], list[Any]]],
    ) -> list[Any]:
        # One server: a script per chunk, all in one round trip; the chunks sent while the
        # store's data was lost and not restored go again after the restore.
        chunks = [
            calls[start : start + _ENQUEUE_CHUNK] for start in range(0, len(calls), _ENQUEUE_CHUNK)
        ]
        barrier = self._barrier()
        marker = barrier.marker if barrier else None
        answers = self._run.call_many(many, [chunk_of(chunk, marker) for chunk in chunks])
        lost = [index for index, answer in enumerate(answers) if not_decided(answer)]
        if lost:
            self._restore_lost(barrier)
            again = self._run.call_many(many, [chunk_of(chunks[index], None) for index in lost])
            for index, answer in zip(lost, again, strict=True):
                answers[index] = answer
        return [
            reply
            for chunk, answer in zip(chunks, answers, strict=True)
            for reply in _chunk_replies(answer, len(chunk))
        ]

    def start_enqueue(self, keys: CallKeys, record: bytes, ttl_ms: int) -> Reply:
        """:meth:`enqueue`, sent now and read later (:meth:`enqueue_result`, same thread):
        the caller does its other work while Redis decides."""
        barrier = self._barrier()
        marked = [keys.call, barrier.marker] if barrier else [keys.call]
        with reraise_unavailable("enqueue", keys.call):
            slot = self._run.send(self._enqueue, marked, [record, ttl_ms], reply=True)
        assert slot is not None
        return slot

    def enqueue_result(
        self, keys: CallKeys, slot: Reply, record: bytes, ttl_ms: int
    ) -> Holder | None:
        """The answer to :meth:`start_enqueue` (of ``record`` and ``ttl_ms``): None
        accepted, else the holder."""
        with reraise_unavailable("enqueue", keys.call):
            reply = self._run.result(slot)
        if not_decided(reply):
            self._restore_lost(self.barrier)
            with reraise_unavailable("enqueue", keys.call):
                reply = self._run(self._enqueue, [keys.call], [record, ttl_ms])
        return read_enqueue(keys.call, reply)

    def publish(
        self,
        keys: CallKeys,
        queued: bytes,
        ttl_ms: int,
        message: str | bytes,
        lists: Sequence[str],
        *,
        provisional: bytes = b"",
        expiring: Sequence[str] = (),
        expire_ms: int = 0,
        force: bool = False,
    ) -> Push | Holder:
        """Create the queued record of a call and push its message to ``lists``, in one step;
        or answer with the holder and push nothing (unless ``force``)."""
        return self.push(
            PendingPush(
                keys, queued, ttl_ms, message, lists, provisional, expiring, expire_ms, force
            )
        )

    def push(self, push: PendingPush) -> Push | Holder:
        """:meth:`publish`, its arguments held in one value."""
        with reraise_unavailable("publish", push.keys.call):
            # (Not sent again once written: pushed, then freed by its run, it would push twice.)
            reply = self._run(self._script_of(push), *push.script_call(), resend=False)
        return read_publish(push.keys.call, reply)

    def publish_many(self, pushes: Sequence[PendingPush]) -> list[Push | Holder]:
        """:meth:`publish` for many calls in one round trip (two when a batch mixes pushes
        that leave latest arguments with pushes that do not: a pipeline runs one script);
        the outcomes in order."""
        key = pushes[0].keys.call if pushes else None
        replies: list[Any] = [None] * len(pushes)
        with reraise_unavailable("publish", key):
            for script, indices in self._by_script(pushes).items():
                # (Not sent again once written: pushed, then freed by its run, it would push
                # twice.)
                answers = self._run.call_many(
                    script, [pushes[index].script_call() for index in indices], resend=False
                )
                for index, answer in zip(indices, answers, strict=True):
                    replies[index] = answer
            _raise_first_error(replies)
        return [
            read_publish(push.keys.call, reply) for push, reply in zip(pushes, replies, strict=True)
        ]

    def _by_script(self, pushes: Sequence[PendingPush]) -> dict[Script, list[int]]:
        groups: dict[Script, list[int]] = {}
        for index, push in enumerate(pushes):
            groups.setdefault(self._script_of(push), []).append(index)
        return groups

    def _script_of(self, push: PendingPush) -> Script:
        return self._publish if push.latest is None else self._publish_latest

    def confirm(self, keys: CallKeys, provisional: bytes, queued: bytes, ttl_ms: int) -> bool:
        """Make a published call's provisional record durable."""
        with reraise_unavailable("confirm", keys.call):
            reply = self._run(self._confirm, [keys.call], [provisional, queued, ttl_ms])
        return read_confirm(reply)

    def send_confirm(self, keys: CallKeys, provisional: bytes, queued: bytes, ttl_ms: int) -> None:
        """:meth:`confirm`, without waiting for the reply: the caller has its result already.
        The connection was checked by this call's enqueue a moment ago; the reply is read
        before this thread's next call, or by the runner's sweeper within a fraction of a
        second (as the process exits, at the latest), and a lost connection sends the
        command again."""
        with reraise_unavailable("confirm", keys.call):
            self._run.send(self._confirm, [keys.call], [provisional, queued, ttl_ms])

    def claim(
        self,
        keys: CallKeys,
        task_id: str,
        token: str,
        lease_ms: int,
        host: str,
        pid: int,
        now: int,
        *,
        keep_record: bool = False,
        record_ttl_ms: int = 0,
        accepted: bool = False,
    ) -> Holder | None:
        """Start a run. None: claimed; a Holder: another run is live on the key.
        ``keep_record``: leave the call's queued record in place (a throttle window).
        ``record_ttl_ms``: keep the running record this long past each renewal, its lease
        carried inside (a run whose message the broker would deliver again); 0: the lease.
        ``accepted``: the message carries the producer's key (it was accepted): one that
        finds another call's queued record runs, and that call waits in its run."""
        args = _claim_args(
            task_id, token, lease_ms, host, pid, now, keep_record, record_ttl_ms, accepted
        )
        with reraise_unavailable("claim", keys.call):
            reply = self._run(self._claim, [keys.call, keys.run], args)
        return read_claim(keys.run, reply)

    def start_claim(
        self,
        keys: CallKeys,
        task_id: str,
        token: str,
        lease_ms: int,
        host: str,
        pid: int,
        now: int,
        *,
        keep_record: bool = False,
        record_ttl_ms: int = 0,
        accepted: bool = False,
    ) -> Reply:
        """:meth:`claim`, sent now and read later (:meth:`claim_result`, same thread): the
        worker sets the run up while Redis decides."""
        args = _claim_args(
            task_id, token, lease_ms, host, pid, now, keep_record, record_ttl_ms, accepted
        )
        with reraise_unavailable("claim", keys.call):
            slot = self._run.send(self._claim, [keys.call, keys.run], args, reply=True)
        assert slot is not None
        return slot

    def claim_result(self, keys: CallKeys, slot: Reply) -> Holder | None:
        """The answer to :meth:`start_claim`: None claimed, else the holder."""
        with reraise_unavailable("claim", keys.call):
            reply = self._run.result(slot)
        return read_claim(keys.run, reply)

    def renew(self, leases: Sequence[Lease]) -> list[Renewal]:
        """Renew leases in one round trip, one answer per lease (a second one for the slots
        of limited keys, when a beat renews both kinds)."""
        slots = [lease for lease in leases if lease.slot]
        if slots:
            answers = dict(zip(map(id, slots), self._renew_slots(slots), strict=True))
            records = [lease for lease in leases if not lease.slot]
            answers.update(
                zip(map(id, records), self.renew(records) if records else [], strict=True)
            )
            return [answers[id(lease)] for lease in leases]
        with reraise_unavailable("renew"):
            if len(leases) == 1:
                lease = leases[0]
                return [read_renew(self._run(self._renew, lease.keys, lease.args()))]
            replies = self._run.call_many(
                self._renew, [(lease.keys, lease.args()) for lease in leases]
            )
            _raise_first_error(replies)
            return [read_renew(reply) for reply in replies]

    def _renew_slots(self, leases: Sequence[Lease]) -> list[Renewal]:
        with reraise_unavailable("renew_slot"):
            replies = self._run.call_many(
                self._renew_slot, [(lease.keys, lease.args()) for lease in leases]
            )
            _raise_first_error(replies)
        return [Renewal.RENEWED if reply == 1 else Renewal.RECREATED for reply in replies]

    # -- flow control per key (key_concurrency, key_rate_limit) --------------------------------

    def take_ticket(self, keys: Mapping[str, str], task_id: str, ttl_ms: int) -> int:
        """A limited call's place in its key's line (ticket.lua): its ticket, in call order."""
        with reraise_unavailable("ticket", keys["line"]):
            reply = self._run(
                self._ticket, [keys["line"], keys["due"], keys["seq"]], [task_id, ttl_ms]
            )
        return _integer("ticket", reply)

    def take_ticket_and_push(
        self,
        keys: Mapping[str, str],
        task_id: str,
        ttl_ms: int,
        message: str | bytes,
        lists: Sequence[str],
        *,
        expiring: Sequence[str] = (),
        expire_ms: int = 0,
    ) -> int:
        """:meth:`take_ticket` and the push of the call's message to ``lists``, in one step
        (ticket_publish.lua): the place and the message both, or neither. Its ticket."""
        with reraise_unavailable("ticket_publish", keys["line"]):
            # (Not sent again once written: a second run would push the message twice.)
            reply = self._run(
                self._ticket_publish,
                [keys["line"], keys["due"], keys["seq"], *lists, *expiring],
                [task_id, ttl_ms, message, len(lists), expire_ms],
                resend=False,
            )
        return _integer("ticket_publish", reply)

    def take_slot(
        self,
        keys: Mapping[str, str],
        task_id: str,
        token: str,
        lease_ms: int,
        limit: int,
        turn_ms: int,
        cap_ms: int,
        ttl_ms: int,
    ) -> int:
        """A run of a limited key asks for a slot (slot.lua): 0 claimed, else how many
        calls (this one included) are ahead of a free slot. A run that waits is asked back
        in ``turn_ms`` for every ``limit`` calls ahead of it, ``cap_ms`` at most
        (:func:`dedupe.values.limits.come_back`); its place lasts until then and a lease."""
        with reraise_unavailable("slot", keys["slots"]):
            reply = self._run(
                self._slot,
                [keys["slots"], keys["line"], keys["due"], keys["seq"]],
                [task_id, token, lease_ms, limit, turn_ms, ttl_ms, cap_ms],
            )
        return _integer("slot", reply)

    def take_slot_and_start(
        self,
        keys: Mapping[str, str],
        task_id: str,
        token: str,
        lease_ms: int,
        limit: int,
        turn_ms: int,
        cap_ms: int,
        ttl_ms: int,
        starts: int,
        period_ms: int,
    ) -> tuple[int, int]:
        """A run of a key with both limits asks for a slot and a start together
        (slot_start.lua): ``(0, 0)`` started; ``(n, 0)`` n calls (this one included) are
        ahead of a free slot; ``(0, ms)`` its turn has come, its start in ``ms``."""
        with reraise_unavailable("slot_start", keys["slots"]):
            reply = self._run(
                self._slot_start,
                [keys[name] for name in ("slots", "line", "due", "seq", "starts", "plan")],
                [task_id, token, lease_ms, limit, turn_ms, ttl_ms, starts, period_ms, cap_ms],
            )
        if not isinstance(reply, list) or len(reply) != 2:
            raise UnexpectedReply("slot_start", reply)
        return _integer("slot_start", reply[0]), _integer("slot_start", reply[1])

    def leave_line(self, keys: Mapping[str, str], task_id: str) -> bool:
        """A limited call whose message was dropped (revoked, expired) leaves its key's line
        (leave_line.lua). True if it had a place."""
        with reraise_unavailable("leave_line", keys["line"]):
            reply = self._run(self._leave_line, [keys["line"], keys["due"], keys["seq"]], [task_id])
        return _integer("leave_line", reply) == 1

    def free_slots_of(self, keys: Mapping[str, str], task_id: str) -> int:
        """Free every slot a task id holds (free_slots_of.lua): its run's child is dead."""
        with reraise_unavailable("free_slots_of", keys["slots"]):
            reply = self._run(self._free_slots_of, [keys["slots"]], [task_id])
        return _integer("free_slots_of", reply)

    def free_slot(self, keys: Mapping[str, str], task_id: str, token: str) -> bool:
        """A run's end frees its slot (free_slot.lua). True if it held one."""
        with reraise_unavailable("free_slot", keys["slots"]):
            reply = self._run(self._free_slot, [keys["slots"]], [slot_member(task_id, token)])
        return _integer("free_slot", reply) == 1

    def next_start(
        self,
        keys: Mapping[str, str],
        task_id: str,
        count: int,
        period_ms: int,
        *,
        token: str = "",
        earliest_ms: int = 0,
    ) -> int:
        """The ms from now to a start of a rate-limited key (start.lua): a producer reserves
        its call's; a run (its ``token`` given) starts now (0, recorded) or is told how long
        to wait (its next start reserved)."""
        mode = f"run {token}" if token else "call"
        with reraise_unavailable("start", keys["starts"]):
            reply = self._run(
                self._start,
                [keys["starts"], keys["plan"]],
                [task_id, count, period_ms, mode, earliest_ms],
            )
        return _integer("start", reply)

    def reserve_start_and_push(
        self,
        keys: Mapping[str, str],
        task_id: str,
        count: int,
        period_ms: int,
        message: EtaSplit,
        lists: Sequence[str],
        *,
        earliest_ms: int = 0,
        expiring: Sequence[str] = (),
        expire_ms: int = 0,
        place: PlaceWait | None = None,
    ) -> StartPush:
        """:meth:`next_start` of a call and the push of its message to ``lists``, in one step
        (start_publish.lua): the message's eta is its reserved start's when that is later
        than ``earliest_ms`` from now. With ``place`` (both limits), its place in line is
        taken too (start_ticket_publish.lua)."""
        head = [keys["starts"], keys["plan"]]
        args: list[Any] = [task_id, count, period_ms, earliest_ms, message.prefix, message.own]
        args += [message.suffix, len(lists), expire_ms]
        name, script = "start_publish", self._start_publish
        if place is not None:
            name, script = "start_ticket_publish", self._start_ticket_publish
            head += [keys["line"], keys["due"], keys["seq"]]
            args += [place.past_start_ms, "" if place.expiry_ms is None else place.expiry_ms]
        with reraise_unavailable(name, keys["starts"]):
            # (Not sent again once written: a second run would push the message twice.)
            reply = self._run(script, [*head, *lists, *expiring], args, resend=False)
        if not isinstance(reply, list) or len(reply) < 2 or not isinstance(reply[1], (bytes, str)):
            raise UnexpectedReply(name, reply)
        eta = reply[1].decode() if isinstance(reply[1], bytes) else reply[1]
        return StartPush(_integer(name, reply[0]), eta)

    def requeue(
        self, keys: CallKeys, task_id: str, token: str, record: bytes, ttl_ms: int
    ) -> Requeue:
        """Put a continuing task id back to queued (or leave the key to its holder)."""
        with reraise_unavailable("requeue", keys.call):
            reply = self._run(
                self._requeue, [keys.call, keys.run], [pack_owner(task_id), token, record, ttl_ms]
            )
        return read_requeue(reply)

    def wait(
        self, keys: CallKeys, task_id: str, record: bytes, ttl_ms: int, since: float = 0.0
    ) -> Wait:
        """Give a deferred message whose record is gone its place again: the free key, or
        the place of the call that gets the key when the holder's run ends, or the key ahead
        of a call accepted after ``since`` (when the message was first deferred)."""
        with reraise_unavailable("wait", keys.call):
            reply = self._run(self._wait, [keys.call], [pack_owner(task_id), record, ttl_ms, since])
        return read_wait(reply)

    def restore(self, restorations: Sequence[Restoration]) -> list[Restore]:
        """Write back the records of messages the broker holds, in one round trip (per
        master), one answer each."""
        if not restorations:
            return []
        with reraise_unavailable("restore"):
            replies = self._run.call_many(
                self._restore, [(item.keys.names, item.args()) for item in restorations]
            )
            _raise_first_error(replies)
            return [read_restore(reply) for reply in replies]

    def restore_run_locks(self, restorations: Sequence[Restoration]) -> list[bool]:
        """Write back the run locks of ``unique_until="started"`` messages the broker holds
        (restore_run_lock.lua), in one round trip (per master); True where one was written."""
        if not restorations:
            return []
        with reraise_unavailable("restore_run_lock"):
            replies = self._run.call_many(
                self._restore_run_lock,
                [([item.keys.run], item.run_lock_args()) for item in restorations],
            )
            _raise_first_error(replies)
        return [reply == 1 for reply in replies]

    def marker(self, key: str) -> bytes | None:
        """The marker ``key``'s value: the run of the server it was set on (see
        :meth:`server_run`). None: the server lost its data (or was never used) and no
        restore finished since: the records of messages in flight may be gone."""
        with reraise_unavailable("marker", key):
            value: bytes | str | None = self._command(lambda: self.client.get(key))
        # (A client made with decode_responses answers text.)
        return value.encode() if isinstance(value, str) else value

    def mark_alive(self, key: str, run: bytes) -> None:
        """Set the marker ``key`` to ``run``: the records of the messages in flight are
        restored on that run of the server."""
        with reraise_unavailable("mark_alive", key):
            self._command(lambda: self.client.set(key, run))

    def server_run(self) -> bytes:
        """This run of the server (its ``run_id``: new at every start, another on a
        failover); empty where the server does not say (INFO refused, or no run_id)."""
        try:
            with reraise_unavailable("info", None):
                info: Any = self._command(lambda: self.client.info("server"))
        except RedisCommandError:
            return b""  # (an ACL or a proxy without INFO: the marker's presence alone)
        return run_id_of(info)

    def release(self, keys: CallKeys, task_id: str, token: str = "") -> int:
        """Delete what this task id (and run, when a token is given) holds; returns the count."""
        with reraise_unavailable("release", keys.call):
            reply = self._run(self._release, [keys.call, keys.run], [pack_owner(task_id), token])
        return read_release(reply)

    def send_release(self, keys: CallKeys, task_id: str, token: str) -> None:
        """:meth:`release`, without waiting for the reply: the end of a run, whose worker
        goes on to its next task at once (the reply is read by :meth:`flush`, or before that
        thread's next call, or by the sweeper within a fraction of a second)."""
        with reraise_unavailable("release", keys.call):
            self._run.send(self._release, [keys.call, keys.run], [pack_owner(task_id), token])

    def flush(self, *, wait: bool = True) -> None:
        """Land this thread's sends (:meth:`send_release`, :meth:`send_confirm`): their
        replies read, or the commands sent again on a new connection if the old one died.
        ``wait=False``: only what has arrived (the rest before this thread's next call, or
        by the runner's sweeper)."""
        with reraise_unavailable("flush", ""):
            self._run.flush(wait=wait)

    def withdraw(self, restoration: Restoration) -> bool:
        """Withdraw what :meth:`restore` wrote for a message that is gone since without
        running (never the records its task id wrote since: a retry, a deferral's next try).
        True if there was something to withdraw."""
        keys = restoration.keys
        with reraise_unavailable("withdraw", keys.call):
            reply = self._run(self._withdraw, keys.names, [restoration.record, restoration.queued])
        return bool(reply)

    def cancel(self, keys: CallKeys, task_id: str, *, exactly: bytes | None = None) -> bool:
        """Delete this task id's record if it is still queued (never a running one);
        ``exactly``: only if the record is these very bytes (a provisional record)."""
        self._forget(keys)
        owner = pack_owner(task_id)
        with reraise_unavailable("cancel", keys.call):
            reply = self._run(self._cancel, [keys.call], [owner, exactly] if exactly else [owner])
        return read_cancel(reply)

    def lookup(self, keys: CallKeys) -> Holder | None:
        """The holder of a call's keys: the queued record first, else the running one."""
        names = keys.names

        def read() -> Holder | None:
            with self.client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.get(name)
                    pipe.pttl(name)
                return first_holder(names, pipe.execute())

        with reraise_unavailable("lookup", keys.call):
            return self._command(read)

    def claim_tick(self, key: str, claimant: bytes, ttl_ms: int) -> bool:
        """Claim one tick of a beat entry (:func:`dedupe.values.keys.tick_key`). True: this beat
        sends the tick; False: another beat claimed it first."""
        with reraise_unavailable("claim_tick", key):
            return bool(self._command(lambda: self.client.set(key, claimant, nx=True, px=ttl_ms)))

    def tick_claimant(self, key: str) -> bytes | None:
        """Who claimed a tick of a beat entry (None: nobody, or the claim expired)."""
        with reraise_unavailable("claim_tick", key):
            claimant = self._command(lambda: self.client.get(key))
        return claimant if isinstance(claimant, bytes) else None

    def clear(self, keys: CallKeys) -> bool:
        """Delete a call's keys whoever holds them. True if anything was deleted."""
        self._forget(keys)
        with reraise_unavailable("clear", keys.call):
            return bool(self._command(lambda: self.client.delete(*keys.names)))

    def _forget(self, keys: CallKeys) -> None:
        # Redis pushes the change to this thread's connection as well, but the caller may
        # ask again before reading it (the write goes on another connection).
        self._run.forget(keys.call)

    def _command(self, attempt: Callable[[], _T]) -> _T:
        """A command of the client itself: on a Cluster under the script runner's retries
        and budget (the cluster client's own are off), else under the client's."""
        return self._run.command(attempt)


@dataclass(frozen=True, slots=True)
class PendingPush:
    """One call's :meth:`Store.publish`, held back to be sent with others."""

    keys: CallKeys
    queued: bytes
    ttl_ms: int
    message: str | bytes
    lists: Sequence[str]
    provisional: bytes = b""
    expiring: Sequence[str] = ()
    expire_ms: int = 0
    force: bool = False
    #: A debounced or replacing call's: what it leaves if it is a duplicate
    #: (publish_latest.lua; None: publish.lua).
    latest: LatestWrite | None = None

    def script_call(self) -> tuple[list[Any], list[Any]]:
        """The keys and arguments of publish.lua (publish_latest.lua) for this push."""
        args: list[Any] = [
            self.queued,
            self.ttl_ms,
            self.provisional,
            self.message,
            len(self.lists),
            "force" if self.force else "",
            self.expire_ms,
        ]
        if self.latest is None:
            return [self.keys.call, *self.lists, *self.expiring], args
        keys = [self.keys.call, self.keys.latest, *self.lists, *self.expiring]
        return keys, [*args, *self.latest.argv()]


#: Calls one ``enqueue_many.lua`` decides at the most: a batch of thousands becomes scripts of
#: this many, pipelined, so that no script holds the server for long.
_ENQUEUE_CHUNK = 256

#: One call of :meth:`Store.enqueue_many`: its keys, provisional record and its ttl, ms.
EnqueueCall = tuple[CallKeys, bytes, int]
#: One call of :meth:`Store.enqueue_latest_many`: as :data:`EnqueueCall`, and what it leaves
#: as a duplicate.
LatestCall = tuple[CallKeys, bytes, int, LatestWrite]
_Call = TypeVar("_Call", EnqueueCall, LatestCall)


def _enqueue_call(call: EnqueueCall) -> tuple[list[Any], list[Any]]:
    keys, record, ttl_ms = call
    return [keys.call], [record, ttl_ms]


def _enqueue_latest_call(call: LatestCall) -> tuple[list[Any], list[Any]]:
    keys, record, ttl_ms, latest = call
    return [keys.call, keys.latest], [record, ttl_ms, *latest.argv()]


def _enqueue_many_call(
    chunk: Sequence[EnqueueCall], marker: str | None
) -> tuple[list[Any], list[Any]]:
    """The keys and arguments of enqueue_many.lua for a chunk of calls (and the marker key,
    flagged by one more argument)."""
    keys: list[Any] = [keys.call for keys, _, _ in chunk]
    args: list[Any] = [part for _, record, ttl_ms in chunk for part in (record, ttl_ms)]
    return _marked(keys, args, marker)


def _enqueue_latest_many_call(
    chunk: Sequence[LatestCall], marker: str | None
) -> tuple[list[Any], list[Any]]:
    """The keys and arguments of enqueue_latest_many.lua for a chunk of calls (and the
    marker key, flagged by one more argument)."""
    keys: list[Any] = []
    args: list[Any] = []
    for call in chunk:
        call_keys, call_args = _enqueue_latest_call(call)
        keys.extend(call_keys)
        args.extend(call_args)
    return _marked(keys, args, marker)


def _marked(keys: list[Any], args: list[Any], marker: str | None) -> tuple[list[Any], list[Any]]:
    if marker is not None:
        keys.append(marker)
        args.append(1)
    return keys, args


def _chunk_replies(reply: Any, size: int) -> list[Any]:
    """The per-call replies of one enqueue_many.lua (an error reply stands for each call)."""
    if isinstance(reply, BaseException):
        return [reply] * size
    if not isinstance(reply, list) or len(reply) != size:
        raise UnexpectedReply("enqueue_many", reply)
    return reply


def slot_member(task_id: str, token: str) -> str:
    """A run's member in its key's slots (slot.lua)."""
    return f"{task_id} {token}"


def _integer(script: str, reply: Any) -> int:
    if isinstance(reply, bool) or not isinstance(reply, int):
        raise UnexpectedReply(script, reply)
    return reply


def _raise_first_error(replies: Sequence[Any]) -> None:
    # Inside reraise_unavailable: "not now" refusals become RedisUnavailable, others
    # RedisCommandError. (On one server a batch is refused whole, for a reason that holds for
    # every call of it; on a Cluster the calls that went through stand, provisional: their
    # ttl frees them.)
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply


def _claim_args(
    task_id: str,
    token: str,
    lease_ms: int,
    host: str,
    pid: int,
    now: int,
    keep_record: bool,
    record_ttl_ms: int,
    accepted: bool,
) -> list[Any]:
    keep = 1 if keep_record else 0
    owner = pack_owner(task_id)
    return [owner, token, lease_ms, host, pid, now, keep, record_ttl_ms, 1 if accepted else 0]
