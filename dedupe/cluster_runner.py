"""Run the Lua scripts on a Redis Cluster, through redis-py's cluster client.

The cluster client routes each EVALSHA to the master of its keys' slot (every key of one call
shares a hash tag, so one slot), follows MOVED and ASK redirects, and learns the new layout
after a failover or a slot migration. What it leaves to its caller is done here:

- NOSCRIPT (a node that never saw the script: a replica promoted by a failover, a restart)
  loads the script on every master and sends the call again;
- "not now" answers that pass with time (TRYAGAIN while a slot's keys are half migrated,
  CLUSTERDOWN during a failover, a lost connection, a redirect chain that ran out of hops)
  are tried again, within the call budget. The cluster client's own retries are turned off,
  so that they do not nest inside these: one loop, one budget.

Nothing is fire-and-forget here: :meth:`ClusterScriptRunner.send` waits for its reply (a
cluster call may go to any node, over any of its connections, so there is no one connection
whose later reads would catch a lost reply).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MovedError,
    NoScriptError,
    ResponseError,
)
from redis.retry import Retry

from .script_runner import Reply

__all__ = ["ClusterScriptRunner"]

_T = TypeVar("_T")

#: Answers of a cluster in flux, tried again until the budget runs out: a slot half migrated
#: (TRYAGAIN), a failover under way (CLUSTERDOWN, a slot not covered yet), a redirect chain
#: longer than the client follows (ClusterError "TTL exhausted").
_IN_FLUX: tuple[type[BaseException], ...] = (
    ClusterDownError,
    ClusterError,
    *(
        getattr(redis.exceptions, name)
        for name in ("TryAgainError", "SlotNotCoveredError")
        if hasattr(redis.exceptions, name)
    ),
)
#: Error replies of a pipelined call that the call alone, through the cluster client, gets
#: past: a redirect, a script the node lacks, the cluster in flux, a failed node.
_PASSING: tuple[type[BaseException], ...] = (
    AskError,
    MovedError,
    NoScriptError,
    *_IN_FLUX,
    redis.ConnectionError,
    redis.TimeoutError,
    OSError,
)
#: Pause between tries of a cluster in flux: a migrating key moves in about a millisecond, a
#: failover takes a node timeout or two.
_FLUX_PAUSE = 0.05
#: How long a cluster may stay in flux for one call when no budget is set.
_FLUX_LIMIT = 5.0


class ClusterScriptRunner:
    """Calls scripts registered on a cluster ``client`` with EVALSHA: the interface of
    :class:`~dedupe.script_runner.ScriptRunner`, on redis-py's cluster client."""

    def __init__(self, client: redis.cluster.RedisCluster, budget: float = 0.0) -> None:
        """``budget``: seconds one call may take in all, retries included (0: the Retry
        policy's count alone)."""
        self._client = client
        self._budget = budget
        self._retry: Retry = getattr(client, "retry", None) or Retry(NoBackoff(), 0)
        # One retry loop (ours, under the budget), not two nested ones.
        client.set_retry(Retry(NoBackoff(), 0))
        self._connection_errors = (redis.ConnectionError, redis.TimeoutError, TimeoutError)
        #: The longest one try can wait for a node that hangs: a retry after a lost
        #: connection starts only if one fits in what is left of the budget.
        self._try_time = float(client.nodes_manager.connection_kwargs.get("socket_timeout") or 0)

    def __call__(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run a script and return its reply."""
        return self._tried(lambda: self._evalsha(script, keys, args))

    def call_many(
        self, script: Script, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
    ) -> list[Any]:
        """Run ``script`` once per ``(keys, args)``, pipelined per master (a round trip for
        each master the calls' slots are on); the replies in order, an error reply as its
        exception in its place. A call redirected (its slot moved or moving), refused for
        a missing script, or cut off runs again alone, through the cluster client."""
        if not calls:
            return []
        replies: list[Any] = [self._replied(script, calls[0])]  # loads a missing script
        if len(calls) == 1:
            return replies
        client: Any = self._client  # (its node API is untyped in redis-py)
        by_node: dict[str, list[int]] = {}
        nodes: dict[str, Any] = {}
        for index in range(1, len(calls)):
            node = client.get_node_from_key(calls[index][0][0])
            nodes[node.name] = node
            by_node.setdefault(node.name, []).append(index)
        replies.extend([None] * (len(calls) - 1))
        for name, indices in by_node.items():
            answers = self._on_node(nodes[name], script, calls, indices)
            for index, reply in zip(indices, answers, strict=True):
                replies[index] = reply
        for index, reply in enumerate(replies):
            if isinstance(reply, BaseException) and not _final(reply):
                replies[index] = self._replied(script, calls[index])
        return replies

    def _on_node(
        self,
        node: Any,
        script: Script,
        calls: Sequence[tuple[Sequence[Any], Sequence[Any]]],
        indices: Sequence[int],
    ) -> list[Any]:
        """One pipeline of calls to one node; a failure of the whole as each call's reply."""
        try:
            pipe: Any = self._client.get_redis_connection(node).pipeline(transaction=False)
            for index in indices:
                keys, args = calls[index]
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            replies: list[Any] = pipe.execute(raise_on_error=False)
            return replies
        except (redis.RedisError, OSError) as exc:
            return [exc] * len(indices)

    def send(
        self, script: Script, keys: Sequence[Any], args: Sequence[Any], *, reply: bool = False
    ) -> Reply | None:
        """Run a script (waiting for its reply, see the module's docstring); with ``reply``,
        the outcome is kept for :meth:`result`."""
        if not reply:
            self(script, keys, args)
            return None
        slot = Reply()
        try:
            slot.settle(self(script, keys, args), None)
        except ResponseError as exc:
            slot.settle(None, exc)
        return slot

    def result(self, slot: Reply) -> Any:
        """The reply kept by a :meth:`send` with ``reply=True``."""
        if slot.error is not None:
            raise slot.error
        return slot.value

    def _evalsha(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        client: Any = self._client  # (evalsha's arguments are untyped in redis-py)
        try:
            return client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            client.script_load(script.script)  # on every master
            return client.evalsha(script.sha, len(keys), *keys, *args)

    def _replied(self, script: Script, call: tuple[Sequence[Any], Sequence[Any]]) -> Any:
        try:
            return self(script, *call)
        except ResponseError as exc:
            return exc

    def _tried(self, attempt: Callable[[], _T]) -> _T:
        """``attempt()``, tried again while the cluster is in flux or a connection failed
        (the latter at most as often as the Retry policy says), within the budget."""
        now = time.monotonic()
        deadline = now + self._budget if self._budget else None
        flux_deadline = deadline if deadline is not None else now + _FLUX_LIMIT
        failures = 0
        while True:
            try:
                return attempt()
            except self._connection_errors:
                failures += 1
                backoff: Any = self._retry._backoff  # (the policy's own backoff, untyped)
                pause = float(backoff.compute(failures))
                if failures > self._retry.get_retries() or _past(deadline, pause + self._try_time):
                    raise
            except _IN_FLUX:
                pause = _FLUX_PAUSE
                if _past(flux_deadline, pause):
                    raise
            time.sleep(pause)


def _final(reply: BaseException) -> bool:
    """Is an error reply of a pipelined call its answer (not a redirect, a missing script or
    a failure of the node, which the call alone, through the cluster client, gets past)?"""
    return not isinstance(reply, _PASSING)


def _past(deadline: float | None, needed: float) -> bool:
    """Would ``needed`` more seconds go past ``deadline``?"""
    return deadline is not None and time.monotonic() + needed > deadline
