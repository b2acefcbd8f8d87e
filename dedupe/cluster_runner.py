"""Run the Lua scripts on a Redis Cluster: on each slot's master over a connection of each
thread's own, and through redis-py's cluster client whenever the layout changes.

Every key of one call shares a hash tag, so one slot, so one master. As long as the layout
holds, a call goes straight to that master through a :class:`~dedupe.script_runner.ScriptRunner`
of its own (the single server's fast path, node by node). Anything that says the layout moved
(a MOVED or ASK redirect, TRYAGAIN, CLUSTERDOWN, a READONLY replica, a lost connection) sends
the call again through redis-py's cluster client, which follows the redirects and learns the
new layout from the cluster; the next calls read their masters from it. What the cluster
client leaves to its caller is done here too:

- NOSCRIPT (a node that never saw the script: a replica promoted by a failover, a restart)
  loads the script on every master and sends the call again;
- "not now" answers that pass with time (TRYAGAIN while a slot's keys are half migrated,
  CLUSTERDOWN during a failover, a lost connection, a redirect chain that ran out of hops)
  are tried again, within the call budget. The cluster client's own retries are turned off,
  so that they do not nest inside these: one loop, one budget.

Nothing is fire-and-forget here: :meth:`ClusterScriptRunner.send` waits for its reply. A
thread's calls go to many masters, so a reply left unread on one (say, MOVED: the release did
not happen) would wait for the thread's next call to that master, which may never come.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    NoScriptError,
    ResponseError,
)
from redis.retry import Retry

from .script_runner import Reply, ScriptRunner

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
#: What a master's runner raises when the layout may have moved: a redirect or a cluster in
#: flux (error replies, told apart by :func:`_moving`), a lost connection (a dead master), a
#: demoted master (READONLY, raised as a lost connection).
_MOVING: tuple[type[BaseException], ...] = (
    ResponseError,
    redis.ConnectionError,
    redis.TimeoutError,
    *_IN_FLUX,
)
#: Error replies that say the layout moved (the runner reads them as plain ResponseErrors).
_MOVED_REPLIES = ("MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN")
#: The reply of a batched call to run again alone.
_AGAIN = object()
#: Pause between tries of a cluster in flux: a migrating key moves in about a millisecond, a
#: failover takes a node timeout or two.
_FLUX_PAUSE = 0.05
#: How long a cluster may stay in flux for one call when no budget is set.
_FLUX_LIMIT = 5.0


class ClusterScriptRunner:
    """Calls scripts registered on a cluster ``client`` with EVALSHA: the interface of
    :class:`~dedupe.script_runner.ScriptRunner`, on a Redis Cluster."""

    def __init__(
        self, client: redis.cluster.RedisCluster, busy_poll: float = 0.0, budget: float = 0.0
    ) -> None:
        """``busy_poll``: as the ScriptRunner's; ``budget``: seconds one call may take in
        all, retries included (0: the Retry policy's count alone)."""
        self._client = client
        self._busy_poll = busy_poll
        self._budget = budget
        #: The runner of each master, by node name, and of each slot whose master is known.
        self._by_node: dict[str, ScriptRunner] = {}
        self._by_slot: dict[int, ScriptRunner] = {}
        self._retry: Retry = getattr(client, "retry", None) or Retry(NoBackoff(), 0)
        #: The policy's count (``Retry.get_retries`` is newer than redis-py 5.0).
        self._retries = int(getattr(self._retry, "_retries", 0))
        # One retry loop (ours, under the budget), not two nested ones.
        client.set_retry(Retry(NoBackoff(), 0))
        self._connection_errors = (redis.ConnectionError, redis.TimeoutError, TimeoutError)
        #: The longest one try can wait for a node that hangs: a retry after a lost
        #: connection starts only if one fits in what is left of the budget.
        self._try_time = float(client.nodes_manager.connection_kwargs.get("socket_timeout") or 0)

    def __call__(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run a script and return its reply."""
        started = time.monotonic()
        runner = self._master(keys[0])
        failed: BaseException | None = None
        if runner is not None:
            try:
                return runner(script, keys, args)
            except _MOVING as exc:
                if not _moving(exc):
                    raise
                failed = exc
        try:
            return self._tried(lambda: self._evalsha(script, keys, args), started, failed)
        finally:
            self._by_slot.clear()  # the cluster client knows the layout now: read it again

    def _master(self, key: Any) -> ScriptRunner | None:
        """The runner of the master that serves ``key``'s slot (None: no master known)."""
        slot = key_slot(key.encode() if isinstance(key, str) else key)
        runner = self._by_slot.get(slot)
        if runner is not None:
            return runner
        client: Any = self._client  # (its node API is untyped in redis-py)
        try:
            node = client.nodes_manager.get_node_from_slot(slot)
        except redis.RedisError:
            return None  # a slot not covered now: the cluster client's retries see to it
        runner = self._by_node.get(node.name)
        if runner is None:
            runner = self._by_node.setdefault(
                node.name,
                # One try: what fails there goes to the cluster client, which retries.
                ScriptRunner(
                    client.get_redis_connection(node),
                    self._busy_poll,
                    self._budget,
                    retry=Retry(NoBackoff(), 0),
                ),
            )
        self._by_slot[slot] = runner
        return runner

    def call_many(
        self, script: Script, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
    ) -> list[Any]:
        """Run ``script`` once per ``(keys, args)``, pipelined per master (a round trip for
        each master the calls' slots are on); the replies in order, an error reply as its
        exception in its place. A call redirected (its slot moved or moving), or cut off,
        runs again alone."""
        replies: list[Any] = [None] * len(calls)
        groups: dict[int, tuple[ScriptRunner | None, list[int]]] = {}
        for index, (keys, _) in enumerate(calls):
            runner = self._master(keys[0])
            groups.setdefault(id(runner), (runner, []))[1].append(index)
        for runner, indices in groups.values():
            try:
                if runner is None:
                    raise redis.ConnectionError("no master known for these slots")
                answers = runner.call_many(script, [calls[index] for index in indices])
            except _MOVING:
                answers = [None] * len(indices)  # each alone, below
            for index, answer in zip(indices, answers, strict=True):
                replies[index] = answer if answer is not None else _AGAIN
        for index, reply in enumerate(replies):
            if reply is _AGAIN or (isinstance(reply, BaseException) and _moving(reply)):
                replies[index] = self._replied(script, calls[index])
        return replies

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

    def _tried(
        self, attempt: Callable[[], _T], started: float, failed: BaseException | None = None
    ) -> _T:
        """``attempt()``, tried again while the cluster is in flux or a connection failed
        (the latter at most as often as the Retry policy says), within the budget of a call
        ``started`` then; ``failed``: how a try made already (on a master's runner) failed."""
        deadline = started + self._budget if self._budget else None
        flux_deadline = deadline if deadline is not None else started + _FLUX_LIMIT
        failures = 0
        error = failed
        while True:
            if error is not None:
                if isinstance(error, self._connection_errors):
                    failures += 1
                    backoff: Any = self._retry._backoff  # (the policy's own, untyped)
                    pause = float(backoff.compute(failures))
                    if failures > self._retries or _past(deadline, pause + self._try_time):
                        raise error
                else:  # a redirect (no pause: the cluster client follows it) or a flux
                    pause = 0.0 if str(error).startswith(("MOVED ", "ASK ")) else _FLUX_PAUSE
                    if _past(flux_deadline, pause):
                        raise error
                time.sleep(pause)
            try:
                return attempt()
            except self._connection_errors as exc:
                error = exc
            except _IN_FLUX as exc:
                error = exc


def _moving(exc: BaseException) -> bool:
    """Does ``exc`` say the layout moved (so the call goes through the cluster client)?"""
    if isinstance(exc, (AskError, *_IN_FLUX, redis.ConnectionError, redis.TimeoutError)):
        return True
    return isinstance(exc, ResponseError) and str(exc).startswith(_MOVED_REPLIES)


def _past(deadline: float | None, needed: float) -> bool:
    """Would ``needed`` more seconds go past ``deadline``?"""
    return deadline is not None and time.monotonic() + needed > deadline
