"""The store's scripts through redis-py's own public code: the plain path, taken where
redis-py has changed a member the store's own client needs (see :mod:`dedupe.compat`).

Correct, and slower: each call goes through the client's pool and redis-py's ``Script``
(EVALSHA, NOSCRIPT answered by loading the script), under the client's retry policy. A
script that must not run twice is sent on a connection with no retries: a lost reply makes
its fate unknown (:class:`~dedupe.store.script_runner.Unanswered`). Nothing is remembered,
and nothing is read later: a send is a call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError, ResponseError

from .runner import RemembersNothing
from .script_runner import Reply, Unanswered

__all__ = ["PlainScriptRunner"]


def _connection_of(pool: Any) -> Any:
    """A connection of ``pool`` (redis-py before 5.1 wants a command name for it)."""
    try:
        return pool.get_connection()
    except TypeError:
        return pool.get_connection("EVALSHA")


def _reply_or_error(connection: Any) -> Any:
    """The next reply on ``connection``; an error reply as its exception, in its place."""
    try:
        return connection.read_response()
    except ResponseError as error:
        return error


_T = TypeVar("_T")


class PlainScriptRunner(RemembersNothing):
    """:class:`~dedupe.store.runner.ScriptCalls` on redis-py's public client API."""

    spans_calls = True

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def __call__(
        self, script: Script, keys: Sequence[Any], args: Sequence[Any], *, resend: bool = True
    ) -> Any:
        if resend:
            return script(keys=keys, args=args, client=self._client)
        reply = self._once(script, [(keys, args)])[0]
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    def call_many(
        self,
        script: Script,
        calls: Sequence[tuple[Sequence[Any], Sequence[Any]]],
        *,
        resend: bool = True,
    ) -> list[Any]:
        if not resend:
            return self._once(script, calls)
        with self._client.pipeline(transaction=False) as pipe:
            for keys, args in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            replies: list[Any] = pipe.execute(raise_on_error=False)
        return self._loaded_again(script, calls, replies, resend)

    def _once(
        self, script: Script, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
    ) -> list[Any]:
        """``calls`` of a script that must not run twice: written once, on a connection of
        the pool's, outside any retry (the client's policy would send them again); a reply
        lost makes their fate unknown."""
        pool = self._client.connection_pool
        connection = _connection_of(pool)
        try:
            commands = [("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls]
            connection.send_packed_command(connection.pack_commands(commands))
            replies = [_reply_or_error(connection) for _ in commands]
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            connection.disconnect()
            raise Unanswered(f"no reply to {script.sha[:8]}: {exc}") from exc
        finally:
            pool.release(connection)
        return self._loaded_again(script, calls, replies, resend=False)

    def _loaded_again(
        self,
        script: Script,
        calls: Sequence[tuple[Sequence[Any], Sequence[Any]]],
        replies: list[Any],
        resend: bool,
    ) -> list[Any]:
        """``replies`` with each NOSCRIPT (it did not run) answered again once the script is
        loaded; the others stand (those ran)."""
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if not missing:
            return replies
        self._client.script_load(script.script)
        again = [calls[i] for i in missing]
        answers = self._once(script, again) if not resend else self.call_many(script, again)
        for index, answer in zip(missing, answers, strict=True):
            replies[index] = answer
        return replies

    def send(
        self, script: Script, keys: Sequence[Any], args: Sequence[Any], *, reply: bool = False
    ) -> Reply | None:
        slot = Reply() if reply else None
        try:
            value = self(script, keys, args)
        except ResponseError as error:
            if slot is None:
                raise
            slot.settle(None, error)
            return slot
        if slot is not None:
            slot.settle(value, None)
        return slot

    def result(self, slot: Reply) -> Any:
        if slot.error is not None:
            raise slot.error
        return slot.value

    def flush(self, *, wait: bool = True) -> None:
        """Nothing is ever owed: every send was read."""

    def command(self, attempt: Callable[[], _T]) -> _T:
        return attempt()
