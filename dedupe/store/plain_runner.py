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
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.exceptions import NoScriptError, ResponseError
from redis.retry import Retry

from .script_runner import Reply, Unanswered

__all__ = ["PlainScriptRunner"]

_T = TypeVar("_T")


class PlainScriptRunner:
    """:class:`~dedupe.store.runner.ScriptCalls` on redis-py's public client API."""

    spans_calls = True

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        # (The same pool: its connections are the client's own, with no retry of ours.)
        once: Any = redis.Redis(connection_pool=client.connection_pool)
        once.set_retry(Retry(NoBackoff(), 0))
        self._once: redis.Redis = once

    def __call__(
        self, script: Script, keys: Sequence[Any], args: Sequence[Any], *, resend: bool = True
    ) -> Any:
        if resend:
            return script(keys=keys, args=args, client=self._client)
        try:
            return script(keys=keys, args=args, client=self._once)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise Unanswered(f"no reply to {script.sha[:8]}: {exc}") from exc

    def call_many(
        self,
        script: Script,
        calls: Sequence[tuple[Sequence[Any], Sequence[Any]]],
        *,
        resend: bool = True,
    ) -> list[Any]:
        client = self._client if resend else self._once
        if not client.script_exists(script.sha)[0]:
            script.sha = client.script_load(script.script)
        with client.pipeline(transaction=False) as pipe:
            for keys, args in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            try:
                replies: list[Any] = pipe.execute(raise_on_error=False)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if resend:
                    raise
                raise Unanswered(f"no reply to {script.sha[:8]}: {exc}") from exc
        if any(isinstance(reply, NoScriptError) for reply in replies):  # (a SCRIPT FLUSH)
            return [self(script, keys, args, resend=resend) for keys, args in calls]
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

    def call_tracked(
        self, script: Script, keys: Sequence[Any], args: Sequence[Any]
    ) -> tuple[Any, float | None]:
        return self(script, keys, args), None

    def worth_tracking(self, key: str) -> bool:
        return False

    def note_duplicate(self, key: str) -> None:
        """Nothing is remembered."""

    def remember(self, key: str, until: float, value: Any) -> None:
        """Nothing is remembered."""

    def remembered(self, key: str) -> Any:
        return None

    def forget(self, key: str) -> None:
        """Nothing is remembered."""
