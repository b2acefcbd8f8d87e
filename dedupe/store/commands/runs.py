"""The store's side of a run: its claim of the key, its lease's renewals, its end (a release,
a requeue of a continuing task id, the latest arguments taken and ended), and a deferred
message's place taken again."""

from __future__ import annotations

from collections.abc import Sequence

from redis.commands.core import Script

from dedupe.store.connections import Reply
from dedupe.store.redis_errors import reraise_unavailable
from dedupe.store.replies import (
    Renewal,
    Requeue,
    Take,
    Wait,
    read_claim,
    read_release,
    read_renew,
    read_requeue,
    read_take,
    read_wait,
)
from dedupe.store.resp import Part
from dedupe.values.keys import CallKeys
from dedupe.values.latest import Latest
from dedupe.values.record import Holder, pack_owner

from .base import StoreBase, raise_first_error
from .leases import Lease, claim_args

__all__ = ["RunCommands"]


class RunCommands(StoreBase):
    """A run's scripts: claim.lua, renew.lua, renew_slot.lua, requeue.lua, wait.lua,
    release.lua, take_latest.lua, end_latest.lua."""

    _claim: Script
    _renew: Script
    _renew_slot: Script
    _requeue: Script
    _wait: Script
    _release: Script
    _take_latest: Script
    _end_latest: Script

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
        replacing: str = "",
    ) -> Holder | None:
        """Start a run. None: claimed; a Holder: another run is live on the key.
        ``keep_record``: leave the call's queued record in place (a throttle window).
        ``record_ttl_ms``: keep the running record this long past each renewal, its lease
        carried inside (a run whose message the broker would deliver again); 0: the lease.
        ``accepted``: the message carries the producer's key (it was accepted): one that
        finds another call's queued record runs, and that call waits in its run.
        ``replacing``: the token of a run of this task id known dead (its process gone),
        whose key this claim takes over before its lease is over."""
        args = claim_args(
            task_id,
            token,
            lease_ms,
            host,
            pid,
            now,
            keep_record,
            record_ttl_ms,
            accepted,
            replacing,
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
        args = claim_args(
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
            raise_first_error(replies)
            return [read_renew(reply) for reply in replies]

    def _renew_slots(self, leases: Sequence[Lease]) -> list[Renewal]:
        with reraise_unavailable("renew_slot"):
            replies = self._run.call_many(
                self._renew_slot, [(lease.keys, lease.args()) for lease in leases]
            )
            raise_first_error(replies)
        return [Renewal.RENEWED if reply == 1 else Renewal.RECREATED for reply in replies]

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

    def poll_for(self, seconds: float) -> None:
        """Poll this long for a reply before sleeping for it, from now on (0: never): a
        prefork pool's process, whose siblings keep every core busy, polls for none."""
        self._run.poll_for(seconds)

    def flush(self, *, wait: bool = True) -> None:
        """Land this thread's sends (:meth:`send_release`, :meth:`send_confirm`): their
        replies read, or the commands sent again on a new connection if the old one died.
        ``wait=False``: only what has arrived (the rest before this thread's next call, or
        by the runner's sweeper)."""
        with reraise_unavailable("flush", ""):
            self._run.flush(wait=wait)

    def take_latest(
        self, keys: CallKeys, task_id: str, retries: int, now: float = 0.0
    ) -> Latest | Take | None:
        """The arguments the duplicates of ``task_id``'s call left for its run, taken
        (None: none left). ``now``: only look, and say whether the deadline passed.
        :attr:`Take.ENDED`: the run of this task id and ``retries`` ended already
        (:meth:`send_end_latest`), and nothing is taken."""
        argv: list[Part] = [pack_owner(task_id), repr(now), retries]
        with reraise_unavailable("take_latest", keys.call):
            reply = self._run(self._take_latest, [keys.latest, keys.ran], argv)
        return read_take(reply)

    def send_end_latest(self, keys: CallKeys, task_id: str, retries: int, horizon_ms: int) -> None:
        """The end of a debounced or replacing run that claimed its key: drop the take kept
        for a resend (and the hash, if that was all), and leave the run's tombstone for
        ``horizon_ms`` (a delivery of the same task id and ``retries`` then does not run),
        without waiting for the reply."""
        argv: list[Part] = [pack_owner(task_id), retries, horizon_ms]
        with reraise_unavailable("end_latest", keys.call):
            self._run.send(self._end_latest, [keys.latest, keys.ran], argv)
