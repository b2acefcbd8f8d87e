"""The record of a message the broker holds for a worker, written back after the dedup Redis
lost its data (restore.lua, restore_run_lock.lua) or withdrawn (withdraw.lua)."""

from __future__ import annotations

from dataclasses import dataclass

from dedupe.store.resp import Part
from dedupe.values.keys import CallKeys
from dedupe.values.record import pack_owner, pack_queued, pack_restored

__all__ = ["Restoration"]


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

    def args(self) -> list[Part]:
        """restore.lua's ARGV."""
        return [pack_owner(self.task_id), self.record, self.queued, self.ttl_ms, self.lease_ms]

    def run_lock_args(self) -> list[Part]:
        """restore_run_lock.lua's ARGV."""
        return [self.record, self.ttl_ms, self.lease_ms]
