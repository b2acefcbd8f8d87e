"""Run the Lua scripts on a Redis Cluster: on each slot's master over a connection of each
thread's own, and through redis-py's cluster client whenever the layout changes.

Every key of one call shares a hash tag, so one slot, so one master. As long as the layout
holds, a call goes straight to that master through a
:class:`~dedupe.store.script_runner.ScriptRunner` of its own (the single server's fast path,
node by node). Anything that says the layout moved (a MOVED or ASK redirect, TRYAGAIN,
CLUSTERDOWN, a READONLY replica, a lost connection) sends the call again through redis-py's
cluster client, which follows the redirects and learns the new layout from the cluster; the
next calls read their masters from it. What the cluster client leaves to its caller is done
here too (listed in the design notes: docs/design-notes.md, "dedupe.store.cluster_runner").
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
    RedisClusterException,
    ResponseError,
)
from redis.retry import Retry

from dedupe.compat.redis_private import backoff_of, retries_of

from .connections import Reply
from .green_pool import script_runner
from .resp import Part
from .runner import RemembersNothing
from .script_runner import ScriptRunner, Unanswered

__all__ = ["ClusterScriptRunner", "cluster_unreachable"]

_T = TypeVar("_T")

#: Answers of a cluster in flux, tried again until the budget runs out: a slot half migrated
#: (TRYAGAIN), a failover under way (CLUSTERDOWN, a slot not covered yet), a redirect chain
#: longer than the client follows (ClusterError "TTL exhausted"), no node reachable to learn
#: the layout from (see :func:`cluster_unreachable`).
_OPTIONAL_FLUX: tuple[type[BaseException], ...] = tuple(
    getattr(redis.exceptions, name)
    for name in ("TryAgainError", "SlotNotCoveredError")
    if hasattr(redis.exceptions, name)  # (not in every redis-py 5)
)
_IN_FLUX: tuple[type[BaseException], ...] = (ClusterDownError, ClusterError, *_OPTIONAL_FLUX)
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    TimeoutError,
)
#: What a try may raise that :func:`_kind` reads.
_TRIED: tuple[type[BaseException], ...] = (
    ResponseError,
    RedisClusterException,
    *_CONNECTION_ERRORS,
    *_IN_FLUX,
)
#: The same, as error replies read as plain ResponseErrors (redis-py before 6 has no class
#: for them in the parser the master's runner uses).
_FLUX_REPLIES = ("TRYAGAIN", "CLUSTERDOWN")
_REDIRECT_REPLIES = ("MOVED ", "ASK ")
#: Pause between tries of a cluster in flux: a migrating key moves in about a millisecond, a
#: failover takes a node timeout or two.
_FLUX_PAUSE = 0.05
#: How long a cluster may stay in flux for one call when no budget is set.
_FLUX_LIMIT = 5.0
#: A batched call to run again alone (its group's round trip failed as a whole).
_AGAIN = object()


def cluster_unreachable(exc: BaseException) -> bool:
    """Is ``exc`` redis-py's cluster client saying the cluster cannot be reached or does
    not serve every slot now (not a misuse of the client, which it raises alike)?"""
    if not isinstance(exc, RedisClusterException):
        return False
    if isinstance(exc, _OPTIONAL_FLUX):  # (SlotNotCoveredError)
        return True
    text = str(exc)
    return "cannot be connected" in text or "not covered" in text


def _kind(exc: BaseException) -> str | None:
    """What a failed try says: "redirect" (the slot moved: follow it at once), "flux" (try
    again after a pause), "connection" (a lost or refused connection: the Retry policy's
    count), or None (an answer: raise it)."""
    if isinstance(exc, AskError):  # (MovedError too)
        return "redirect"
    if isinstance(exc, _CONNECTION_ERRORS):
        return "connection"
    if isinstance(exc, _IN_FLUX):
        return "flux"
    if isinstance(exc, RedisClusterException):
        return "flux" if cluster_unreachable(exc) else None
    if isinstance(exc, ResponseError):
        text = str(exc)
        if text.startswith(_REDIRECT_REPLIES):
            return "redirect"
        if text.startswith(_FLUX_REPLIES):
            return "flux"
    return None


class ClusterScriptRunner(RemembersNothing):
    """Calls scripts registered on a cluster ``client`` with EVALSHA: the interface of
    :class:`~dedupe.store.script_runner.ScriptRunner`, on a Redis Cluster. It remembers no
    answer (a thread's tracking would need a connection to every master)."""

    #: Each call's keys live on their own slot: a script per call.
    spans_calls = False

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
        self._retries = retries_of(self._retry)
        # One retry loop (ours, under the budget), not two nested ones: every command of the
        # store on a cluster goes through it (see :meth:`command`).
        client.set_retry(Retry(NoBackoff(), 0))
        if hasattr(client, "cluster_error_retry_attempts"):  # (redis-py before 6 loops on it)
            client.cluster_error_retry_attempts = 0
        #: The longest one try can wait for a node that hangs: a retry after a lost
        #: connection starts only if one fits in what is left of the budget.
        self._try_time = float(client.nodes_manager.connection_kwargs.get("socket_timeout") or 0)

    def poll_for(self, seconds: float) -> None:
        """Poll this long for a reply from now on, on every master's runner."""
        self._busy_poll = seconds
        for runner in self._by_node.values():
            runner.poll_for(seconds)

    def __call__(
        self, script: Script, keys: Sequence[Part], args: Sequence[Part], *, resend: bool = True
    ) -> object:
        """Run a script and return its reply (``resend``: as the ScriptRunner's)."""
        return self._call(script, keys, args, time.monotonic(), resend)

    def command(self, attempt: Callable[[], _T]) -> _T:
        """Run a command of the cluster client (``attempt``) under the same retries and
        budget as the scripts."""
        return self._tried(attempt, time.monotonic())

    def _call(
        self,
        script: Script,
        keys: Sequence[Part],
        args: Sequence[Part],
        started: float,
        resend: bool = True,
    ) -> object:
        runner = self._master(keys[0])
        failed: BaseException | None = None
        if runner is not None:
            try:
                return runner(script, keys, args, resend=resend)
            except _TRIED as exc:
                if _kind(exc) is None:  # (Unanswered too: written, so not sent again)
                    raise
                failed = exc

        def evalsha() -> object:
            try:
                return self._evalsha(script, keys, args)
            except _TRIED as exc:
                if not resend and _kind(exc) == "connection":  # (cut off: it may have run)
                    raise Unanswered(f"no reply from the cluster to a script ({exc})") from exc
                raise

        try:
            return self._tried(evalsha, started, failed)
        finally:
            self._by_slot.clear()  # the cluster client knows the layout now: read it again

    def _master(self, key: Any) -> ScriptRunner | None:
        """The runner of the master that serves ``key``'s slot (None: no master known, or no
        runner of ours at all: redis-py changed a member it needs)."""
        slot = key_slot(key.encode() if isinstance(key, str) else key)
        runner = self._by_slot.get(slot)
        if runner is not None:
            return runner
        client: Any = self._client  # (its node API is untyped in redis-py)
        try:
            node = client.nodes_manager.get_node_from_slot(slot)
        except (redis.RedisError, RedisClusterException):
            return None  # a slot not covered now: the cluster client's path sees to it
        runner = self._by_node.get(node.name)
        if runner is None:
            runner = self._by_node.setdefault(
                node.name,
                # One try: what fails there goes to the cluster client, under our retries.
                script_runner(
                    client.get_redis_connection(node),
                    self._busy_poll,
                    self._budget,
                    retry=Retry(NoBackoff(), 0),
                ),
            )
        self._by_slot[slot] = runner
        return runner

    def call_many(
        self,
        script: Script,
        calls: Sequence[tuple[Sequence[Part], Sequence[Part]]],
        *,
        resend: bool = True,
    ) -> list[object]:
        """Run ``script`` once per ``(keys, args)``, pipelined per master (a round trip for
        each master the calls' slots are on); the replies in order, an error reply as its
        exception in its place. A call redirected (its slot moved or moving), or cut off,
        runs again alone, within one budget for the whole batch."""
        started = time.monotonic()
        replies: list[object] = [_AGAIN] * len(calls)
        groups: dict[int, tuple[ScriptRunner | None, list[int]]] = {}
        for index, (keys, _) in enumerate(calls):
            runner = self._master(keys[0])
            groups.setdefault(id(runner), (runner, []))[1].append(index)
        for runner, indices in groups.values():
            if runner is None:
                continue  # each alone, below
            try:
                answers = runner.call_many(
                    script, [calls[index] for index in indices], resend=resend
                )
            except _TRIED as exc:
                if _kind(exc) is None:
                    raise
                continue  # each alone, below
            for index, answer in zip(indices, answers, strict=True):
                replies[index] = answer
        last: BaseException | None = None
        for index, reply in enumerate(replies):
            if reply is not _AGAIN and not (
                isinstance(reply, BaseException) and _kind(reply) is not None
            ):
                continue
            if last is not None and _past(self._deadline(started), 0.0):
                replies[index] = last  # the batch's budget is spent: no more tries
                continue
            try:
                replies[index] = self._call(script, *calls[index], started, resend)
            except _TRIED as exc:
                replies[index] = last = exc
        return replies

    def send(
        self, script: Script, keys: Sequence[Part], args: Sequence[Part], *, reply: bool = False
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

    def result(self, slot: Reply) -> object:
        """The reply kept by a :meth:`send` with ``reply=True``."""
        if slot.error is not None:
            raise slot.error
        return slot.value

    def flush(self, *, wait: bool = True) -> None:
        """Nothing to read: every send waited for its reply."""

    def _evalsha(self, script: Script, keys: Sequence[Part], args: Sequence[Part]) -> object:
        client: Any = self._client  # (evalsha's arguments are untyped in redis-py)
        try:
            return client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            client.script_load(script.script)  # on every master
            return client.evalsha(script.sha, len(keys), *keys, *args)

    def _deadline(self, started: float) -> float | None:
        return started + self._budget if self._budget else None

    def _tried(
        self, attempt: Callable[[], _T], started: float, failed: BaseException | None = None
    ) -> _T:
        """``attempt()``, tried again while the cluster is in flux or a connection failed
        (the latter at most as often as the Retry policy says), within the budget of a call
        ``started`` then; ``failed``: how a try made already (on a master's runner) failed.
        A try starts only if it fits in what is left of the budget."""
        deadline = self._deadline(started)
        flux_deadline = deadline if deadline is not None else started + _FLUX_LIMIT
        failures = 0
        error = failed
        while True:
            if error is not None:
                kind = _kind(error)
                if kind == "connection":
                    failures += 1
                    backoff = backoff_of(self._retry)
                    pause = float(backoff.compute(failures))
                    if failures > self._retries or _past(deadline, pause + self._try_time):
                        raise error
                elif kind == "redirect":
                    pause = 0.0  # the cluster client follows it
                    if _past(deadline, self._try_time):
                        raise error
                elif kind == "flux":
                    pause = _FLUX_PAUSE
                    if _past(flux_deadline, pause + self._try_time):
                        raise error
                else:
                    raise error
                if pause:
                    time.sleep(pause)
            try:
                return attempt()
            except _TRIED as exc:
                if _kind(exc) is None:
                    raise
                error = exc


def _past(deadline: float | None, needed: float) -> bool:
    """Would ``needed`` more seconds go past ``deadline``?"""
    return deadline is not None and time.monotonic() + needed > deadline
