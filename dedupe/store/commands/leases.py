"""A run's hold on its key: the claim's arguments (claim.lua), the lease a heartbeat renews
(renew.lua, renew_slot.lua), and a run's member in its key's slots."""

from __future__ import annotations

from dataclasses import dataclass

from dedupe.store.resp import Part
from dedupe.values.record import pack_owner

__all__ = ["Lease", "claim_args", "slot_member"]


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

    def args(self) -> list[Part]:
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


def slot_member(task_id: str, token: str) -> str:
    """A run's member in its key's slots (slot.lua)."""
    return f"{task_id} {token}"


def claim_args(
    task_id: str,
    token: str,
    lease_ms: int,
    host: str,
    pid: int,
    now: int,
    keep_record: bool,
    record_ttl_ms: int,
    accepted: bool,
    replacing: str = "",
) -> list[Part]:
    """claim.lua's ARGV (``replacing``: the token of this task id's dead run, if any)."""
    keep = 1 if keep_record else 0
    owner = pack_owner(task_id)
    args: list[Part] = [
        owner,
        token,
        lease_ms,
        host,
        pid,
        now,
        keep,
        record_ttl_ms,
        1 if accepted else 0,
    ]
    return [*args, replacing] if replacing else args
