"""The store's publishes: a call's record and its message pushed in one step (a Redis broker
that is the store's own server), alone or in a batch; their confirmation; and a call
withdrawn before it runs."""

from __future__ import annotations

from collections.abc import Sequence

from redis.commands.core import Script

from dedupe.store.redis_errors import reraise_unavailable
from dedupe.store.replies import Push, read_cancel, read_confirm, read_publish
from dedupe.values.keys import CallKeys
from dedupe.values.record import Holder, pack_owner

from .base import StoreBase, raise_first_error
from .pushes import PendingPush

__all__ = ["PublishCommands"]


class PublishCommands(StoreBase):
    """Publishing a call (publish.lua, publish_latest.lua), confirming it (confirm.lua) and
    cancelling it (cancel.lua)."""

    _publish: Script
    _publish_latest: Script
    _confirm: Script
    _cancel: Script

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
        replies: list[object] = [None] * len(pushes)
        with reraise_unavailable("publish", key):
            for script, indices in self._by_script(pushes).items():
                # (Not sent again once written: pushed, then freed by its run, it would push
                # twice.)
                answers = self._run.call_many(
                    script, [pushes[index].script_call() for index in indices], resend=False
                )
                for index, answer in zip(indices, answers, strict=True):
                    replies[index] = answer
            raise_first_error(replies)
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

    def cancel(self, keys: CallKeys, task_id: str, *, exactly: bytes | None = None) -> bool:
        """Delete this task id's record if it is still queued (never a running one);
        ``exactly``: only if the record is these very bytes (a provisional record)."""
        self._forget(keys)
        owner = pack_owner(task_id)
        with reraise_unavailable("cancel", keys.call):
            reply = self._run(self._cancel, [keys.call], [owner, exactly] if exactly else [owner])
        return read_cancel(reply)
