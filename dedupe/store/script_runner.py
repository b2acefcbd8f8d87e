"""Run the Lua scripts over a redis-py connection of each thread's own: every call's hot path.

redis-py's ``Script.__call__`` takes the client's full command path (a pooled connection
checked out and back, instrumentation, the general packer): on loopback as much as the round
trip itself. Here each thread keeps a redis-py ``Connection`` of its own, made from the pool's
class and settings (TLS, unix sockets, auth, the database, timeouts), and uses its public
methods: ``send_packed_command``, ``can_read``, ``read_response`` (redis-py's parser reads
every reply kind, hiredis's where installed). Kept on top, as measured to pay: the cached
packer, a busy poll for the reply, sends read later, NOSCRIPT reloads, the call budget, and a
guard for replies owed. Below it: each thread's connection (:mod:`dedupe.store.connections`)
and the sends whose replies are read later (:mod:`dedupe.store.deferred`).

Design notes: docs/design-notes.md, "dedupe.store.script_runner".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError, ResponseError

from .deferred import DefersReads
from .runner import RemembersNothing

if TYPE_CHECKING:
    from .resp import Part

__all__ = ["ScriptRunner", "Unanswered"]

_T = TypeVar("_T")


class Unanswered(redis.RedisError):
    """A script that must not run twice was sent and its reply never came (a timeout, a lost
    connection): it may have run, so it is not sent again. Not retried by a Retry policy."""


class ScriptRunner(RemembersNothing, DefersReads):
    """Calls scripts registered on ``client`` with EVALSHA, one connection per thread.
    (tracking.py's runner also remembers answers.)"""

    #: One server holds every key: one script may decide many calls.
    spans_calls = True

    def __call__(
        self, script: Script, keys: Sequence[Part], args: Sequence[Part], *, resend: bool = True
    ) -> object:
        """Run a script and return its reply. ``resend=False``: a script that must not run
        twice (it pushes a message): tried again only if it was not written, else
        :class:`Unanswered`."""
        command = self._pack(script, keys, args)
        call = self._call if resend else self._call_once
        with self._local.lock:
            try:
                return call(script, command)
            except self._retried as first:  # (the retry's closure made only when needed)
                return self._retrying(first, lambda: call(script, command))

    def _call_once(self, script: Script, command: bytes) -> object:
        try:
            return self._call(script, command)
        except self._retried as exc:
            if self._local.wrote:
                raise Unanswered(f"no reply from the dedup Redis to a script sent ({exc})") from exc
            raise

    def command(self, attempt: Callable[[], _T]) -> _T:
        """``attempt()``: a command of the client itself, under the client's own retries."""
        return attempt()

    def call_many(
        self,
        script: Script,
        calls: Sequence[tuple[Sequence[Part], Sequence[Part]]],
        *,
        resend: bool = True,
    ) -> list[object]:
        """Run ``script`` once per ``(keys, args)``, pipelined: one round trip for them all.
        The replies in order, an error reply as its exception in its place. A lost
        connection sends them all again (under the Retry policy), unless ``resend=False``
        (see :meth:`__call__`): the scripts answer a resent command as its first sending did
        while its key still holds what the first wrote."""
        with self._local.lock:
            replies: list[object] = []
            if calls and script.sha not in self._known:
                # The first alone loads the script if the server lacks it (NOSCRIPT).
                replies.append(self._replied(script, calls[0], resend))
                calls = calls[1:]
            if not calls:
                return replies
            command = b"".join([self._pack(script, keys, args) for keys, args in calls])
            rest = self._tried(lambda: self._pipelined(command, len(calls), resend))
            for index, reply in enumerate(rest):
                if isinstance(reply, NoScriptError):  # flushed between the first and the rest
                    rest[index] = self._replied(script, calls[index], resend)
            return replies + rest

    def _pipelined(self, command: bytes, count: int, resend: bool) -> list[object]:
        """One try of :meth:`call_many`: ``count`` commands written at once, their replies
        read (an error reply in its place)."""
        self._write(command, count)
        got: list[object] = []
        try:
            for _ in range(count):
                try:
                    got.append(self._read())
                except ResponseError as exc:  # read whole: the stream is in step
                    got.append(exc)
        except self._retried as exc:
            self._drop_connection()
            if not resend:
                raise Unanswered(f"no reply from the dedup Redis to scripts sent ({exc})") from exc
            raise
        except BaseException:
            self._drop_connection()
            raise
        for reply in got:
            if isinstance(reply, ResponseError):
                self._check_demoted(reply)
        return got

    def _replied(
        self, script: Script, call: tuple[Sequence[Part], Sequence[Part]], resend: bool
    ) -> object:
        try:
            return self(script, *call, resend=resend)
        except ResponseError as exc:
            return exc

    def _call(self, script: Script, command: bytes) -> object:
        self._write(command)
        return self._reply(script, command)
