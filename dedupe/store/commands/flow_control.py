"""The store's flow control per key (``key_concurrency``, ``key_rate_limit``): a call's place in
its key's line, a run's slot, and the starts of a rate-limited key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from redis.commands.core import Script

from dedupe.errors import UnexpectedReply
from dedupe.store.redis_errors import reraise_unavailable
from dedupe.store.resp import Part

from .base import StoreBase, integer_reply
from .leases import slot_member
from .starts import EtaSplit, PlaceWait, StartPush

__all__ = ["FlowControlCommands"]


class FlowControlCommands(StoreBase):
    """Lines, slots and starts of limited keys (ticket.lua, slot.lua, start.lua and the
    scripts that take them together or with a push)."""

    _ticket: Script
    _ticket_publish: Script
    _slot: Script
    _slot_start: Script
    _free_slot: Script
    _free_slots_of: Script
    _leave_line: Script
    _start: Script
    _start_publish: Script
    _start_ticket_publish: Script

    def take_ticket(self, keys: Mapping[str, str], task_id: str, ttl_ms: int) -> int:
        """A limited call's place in its key's line (ticket.lua): its ticket, in call order."""
        with reraise_unavailable("ticket", keys["line"]):
            reply = self._run(
                self._ticket, [keys["line"], keys["due"], keys["seq"]], [task_id, ttl_ms]
            )
        return integer_reply("ticket", reply)

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
        return integer_reply("ticket_publish", reply)

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
        return integer_reply("slot", reply)

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
        return integer_reply("slot_start", reply[0]), integer_reply("slot_start", reply[1])

    def leave_line(self, keys: Mapping[str, str], task_id: str) -> bool:
        """A limited call whose message was dropped (revoked, expired) leaves its key's line
        (leave_line.lua). True if it had a place."""
        with reraise_unavailable("leave_line", keys["line"]):
            reply = self._run(self._leave_line, [keys["line"], keys["due"], keys["seq"]], [task_id])
        return integer_reply("leave_line", reply) == 1

    def give_back_start(self, keys: Mapping[str, str], task_id: str) -> bool:
        """A call of a rate-limited key whose publish failed gives its reserved start back to
        the key's plan (ZREM), for the next call. True if it had one."""
        with reraise_unavailable("give_back_start", keys["plan"]):
            return bool(self._command(lambda: self.client.zrem(keys["plan"], task_id)))

    def free_slots_of(self, keys: Mapping[str, str], task_id: str) -> int:
        """Free every slot a task id holds (free_slots_of.lua): its run's child is dead."""
        with reraise_unavailable("free_slots_of", keys["slots"]):
            reply = self._run(self._free_slots_of, [keys["slots"]], [task_id])
        return integer_reply("free_slots_of", reply)

    def free_slot(self, keys: Mapping[str, str], task_id: str, token: str) -> bool:
        """A run's end frees its slot (free_slot.lua). True if it held one."""
        with reraise_unavailable("free_slot", keys["slots"]):
            reply = self._run(self._free_slot, [keys["slots"]], [slot_member(task_id, token)])
        return integer_reply("free_slot", reply) == 1

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
        return integer_reply("start", reply)

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
        args: list[Part] = [task_id, count, period_ms, earliest_ms, message.prefix, message.own]
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
        return StartPush(integer_reply(name, reply[0]), eta)
