"""The store's recovery from a lost dataset: the records of messages the broker holds written
back (and withdrawn once their message is gone), and the marker that tells a server lost
its data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.commands.core import Script

from dedupe.errors import RedisCommandError
from dedupe.store.redis_errors import reraise_unavailable
from dedupe.store.replies import Restore, read_restore, run_id_of

from .base import StoreBase, raise_first_error
from .restorations import Restoration

__all__ = ["RecoveryCommands"]


class RecoveryCommands(StoreBase):
    """restore.lua, restore_run_lock.lua, withdraw.lua, and the marker's commands."""

    _restore: Script
    _restore_run_lock: Script
    _withdraw: Script

    def restore(self, restorations: Sequence[Restoration]) -> list[Restore]:
        """Write back the records of messages the broker holds, in one round trip (per
        master), one answer each."""
        if not restorations:
            return []
        with reraise_unavailable("restore"):
            replies = self._run.call_many(
                self._restore, [(item.keys.names, item.args()) for item in restorations]
            )
            raise_first_error(replies)
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
            raise_first_error(replies)
        return [reply == 1 for reply in replies]

    def withdraw(self, restoration: Restoration) -> bool:
        """Withdraw what :meth:`restore` wrote for a message that is gone since without
        running (never the records its task id wrote since: a retry, a deferral's next try).
        True if there was something to withdraw."""
        keys = restoration.keys
        with reraise_unavailable("withdraw", keys.call):
            reply = self._run(self._withdraw, keys.names, [restoration.record, restoration.queued])
        return bool(reply)

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
