"""The script runner that remembers answers: Redis tracks the keys a thread's calls read (RESP3
client tracking, OPTIN), and pushes an invalidation when one changes; until then a repeated
duplicate is answered from memory, with no round trip.

Only keys met held a moment ago are tracked (Redis keeps every tracked key in its table
until it changes). The pushes come on the thread's own connection, to its push handler,
between replies or (when nothing is owed) read at once without waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.commands.core import Script
from redis.connection import AbstractConnection
from redis.exceptions import NoPermissionError, ResponseError
from redis.retry import Retry

from dedupe.compat.redis_private import hear_pushes

from . import connections
from .remembered import Answer
from .resp import Part, pack_command
from .script_runner import ScriptRunner

__all__ = ["TrackingScriptRunner"]

logger = logging.getLogger("dedupe.store")

_TRACKING_ON = pack_command(b"CLIENT", b"TRACKING", b"ON", b"OPTIN")
_CACHING_YES = pack_command(b"CLIENT", b"CACHING", b"YES")


class TrackingScriptRunner(ScriptRunner):
    """:class:`ScriptRunner` that also keeps answers for ``remember_for`` seconds at most,
    while Redis says nothing of their keys."""

    def __init__(
        self,
        client: redis.Redis,
        busy_poll: float = 0.0,
        budget: float = 0.0,
        retry: Retry | None = None,
        remember_for: float = 0.0,
    ) -> None:
        super().__init__(client, busy_poll, budget, retry)
        self._remember_for = remember_for
        #: The server refused RESP3 or tracking: remember nothing.
        self._tracking_refused = False

    def _settings(self, local: Any) -> dict[str, Any]:
        settings = super()._settings(local)
        if not self._tracking_refused:
            settings["protocol"] = 3  # pushes come on the connection itself
        return settings

    def _open(self, settings: dict[str, Any]) -> AbstractConnection:
        try:
            return super()._open(settings)
        except ResponseError as exc:
            if settings.get("protocol") != 3 or not _cannot_track(exc):
                raise
            # No HELLO 3 (Redis before 6, or a proxy): RESP2, and nothing remembered.
            self._refuse_tracking(exc)
            return super()._open({**settings, "protocol": 2})

    def _opened(self, connection: AbstractConnection) -> None:
        local = self._local
        local.tracking = False
        if self._tracking_refused or not hear_pushes(connection, local.known.hear):
            return
        self._send(_TRACKING_ON)
        try:
            self._read()
        except ResponseError as exc:
            self._refuse_tracking(exc)
            return
        except BaseException:
            self._drop_connection()
            raise
        local.tracking = True

    def _refuse_tracking(self, exc: ResponseError) -> None:
        """Track nothing on this connection; on the next ones too if the server cannot or
        may not (a Redis before 6, a proxy, an ACL), not for an answer of the moment."""
        self._local.tracking = False
        if self._tracking_refused or not _cannot_track(exc):
            return
        self._tracking_refused = True
        logger.info(
            "the dedup Redis cannot track keys for this client (%s): every duplicate is "
            "asked of Redis",
            exc,
        )

    def call_tracked(
        self, script: Script, keys: Sequence[Part], args: Sequence[Part]
    ) -> tuple[object, float | None]:
        """Run a script with Redis tracking the keys it reads for this thread (when the
        server can): its reply, and when it was sent (time.monotonic()) if the keys are
        tracked from then on, else None. :meth:`remember` keeps an answer made of it."""
        command = self._pack(script, keys, args)
        sent_at: list[float | None] = [None]
        local = self._local

        def attempt() -> object:
            self._connection()  # (a new connection starts tracking here)
            if not local.tracking or script.sha not in self._known:
                sent_at[0] = None
                return self._call(script, command)
            reloads, sent_at[0] = local.reloads, time.monotonic()
            self._write(_CACHING_YES + command, 2)
            try:
                self._read()  # +OK
            except ResponseError as exc:
                # The call goes on, untracked: an ACL that allows TRACKING but not CACHING
                # (for good), or an answer of the moment (BUSY, LOADING: this call only).
                sent_at[0] = None
                if _cannot_track(exc):
                    self._refuse_tracking(exc)
                    local.known.clear()
            except BaseException:
                self._drop_connection()
                raise
            reply = self._reply(script, command)
            if local.reloads != reloads:
                sent_at[0] = None  # sent again after NOSCRIPT, untracked
            return reply

        with local.lock:
            return self._tried(attempt), sent_at[0]

    def remember(self, key: str, until: float, value: Answer) -> None:
        """Keep ``value`` as this thread's answer for ``key`` until Redis says the key changed,
        or ``until`` (time.monotonic(); capped at ``remember_for`` from now). Only for a key a
        :meth:`call_tracked` just read, tracked."""
        local = self._local
        with local.lock:
            if local.tracking:
                local.known.keep(key.encode(self._encoding), until, value)

    def note_duplicate(self, key: str) -> None:
        """``key`` was met held (asked untracked): a duplicate of it again within
        ``remember_for`` is worth tracking (:meth:`worth_tracking`)."""
        local = self._local
        with local.lock:
            if local.tracking:
                local.known.keep(
                    key.encode(self._encoding), time.monotonic() + self._remember_for, None
                )

    def worth_tracking(self, key: str) -> bool:
        """Was ``key`` met held (or remembered) in this thread within ``remember_for``? Only
        such keys are tracked: Redis keeps every tracked key in its table until it changes,
        so the first meeting of a key asks untracked."""
        return self._local.known.is_fresh(key.encode(self._encoding))

    def remembered(self, key: str) -> Answer | None:
        """This thread's remembered answer for ``key``, or None: Redis has said nothing of the
        key since it was remembered, and nothing waits to be read on the connection (bytes
        that do may be an invalidation, read now: the answer is then looked up again)."""
        local = self._local
        known = local.known
        if not known:
            return None
        if local.forks != connections.forks:
            known.clear()  # the parent's memory, and its connection
            return None
        name = key.encode(self._encoding)
        with local.lock:  # (the sweeper may read this connection too)
            if known.answer(name) is None:
                return None
            try:
                if not self._quiet():
                    return None
            except redis.RedisError:
                self._drop_connection()
                return None
            return known.answer(name)  # (again: a push just read may have dropped it)

    def forget(self, key: str) -> None:
        """Drop this thread's remembered answer for ``key`` (a write of this process's own)."""
        local = self._local
        with local.lock:
            local.known.drop(key.encode(self._encoding))

    def _quiet(self) -> bool:
        """Is the tracking connection in step, with no reply owed to an earlier send? Pushes
        that arrived are read first (they drop what they name). Never waits for more than
        the rest of a push that has begun to arrive."""
        local = self._local
        connection = local.connection
        if connection is None or not local.tracking or local.owed != len(local.pending):
            local.known.clear()  # (no connection, or one cut short: it is dropped next)
            return False
        if local.pending or local.unsent:
            return False
        while connection.can_read(0):  # (only pushes: no reply is owed)
            connection.read_response(disable_decoding=True, push_request=True)
        return True


def _cannot_track(exc: ResponseError) -> bool:
    """Does this refusal of HELLO 3, CLIENT TRACKING or CLIENT CACHING mean the server cannot
    or may not track keys for this client (rather than "not now")?"""
    text = str(exc).lstrip("-").lower()
    return isinstance(exc, NoPermissionError) or text.startswith(
        ("unknown command", "unknown subcommand", "err unknown", "noperm", "noproto")
    )
