"""The script runner under gevent's or eventlet's monkey-patching: calls share a bounded set of
connections, each checked out for a call and given back after it.

Patched, ``threading.local`` is per greenlet, and a ``-P gevent`` worker or a gevent web
server runs every task or request in a new greenlet: a connection per "thread" became a
connection, and its handshake, per call (12.9 times the cost of a call on a kept connection),
with no cap on how many. A connection's state (``ConnectionState``: its socket, the replies owed on
it, its lock) moves with the connection, so every invariant of the per-thread runner holds
per connection: whoever uses a connection next reads what it owes first, under its lock;
the sweeper lands what nobody read.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
from redis.commands.core import Script
from redis.retry import Retry

from .connections import DEFAULT_MAX_CONNECTIONS, ConnectionState, Reply, connection_cap
from .resp import Part
from .script_runner import ScriptRunner
from .tracking import TrackingScriptRunner

__all__ = ["DEFAULT_MAX_CONNECTIONS", "GreenScriptRunner", "monkey_patched", "script_runner"]

_T = TypeVar("_T")


def monkey_patched() -> bool:
    """Are threads greenlets here (gevent's or eventlet's monkey-patching)? Never imports
    either: a process that has not imported them has not patched anything."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return True
    patcher = sys.modules.get("eventlet.patcher")
    return patcher is not None and bool(patcher.is_monkey_patched("thread"))


def script_runner(
    client: redis.Redis,
    busy_poll: float = 0.0,
    budget: float = 0.0,
    retry: Retry | None = None,
    remember_for: float = 0.0,
) -> ScriptRunner:
    """A :class:`ScriptRunner` of ``client`` (its arguments), whose connections are shared by
    the calls of every greenlet where threads are greenlets; one that remembers answers
    where ``remember_for`` asks it to and threads are threads."""
    if monkey_patched():
        return GreenScriptRunner(client, busy_poll, budget, retry)
    if remember_for > 0:
        return TrackingScriptRunner(client, busy_poll, budget, retry, remember_for)
    return ScriptRunner(client, busy_poll, budget, retry)


class _Held:
    """Each greenlet's connection while it is in a call, by the greenlet's ident: a patched
    ``threading.local`` makes its storage anew in each greenlet, which costs a third of a
    loopback call, once per task or request."""

    __slots__ = ("by_ident",)

    def __init__(self) -> None:
        self.by_ident: dict[int, ConnectionState] = {}

    @property
    def local(self) -> ConnectionState | None:
        return self.by_ident.get(threading.get_ident())

    @local.setter
    def local(self, local: ConnectionState | None) -> None:
        if local is None:
            self.by_ident.pop(threading.get_ident(), None)
        else:
            self.by_ident[threading.get_ident()] = local


class _Pool:
    """The connections one runner shares. Replaced whole in a forked child: a lock a
    parent's greenlet held at the fork would never be let go there."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.made = 0
        self.free: list[
            ConnectionState
        ] = []  # (the last given back is taken first: its socket is warm)
        self.given_back = threading.Condition(threading.Lock())


class GreenScriptRunner(ScriptRunner):
    """:class:`ScriptRunner` with connections checked out per call instead of kept per thread
    (:func:`script_runner` makes one when threads are greenlets).

    Nothing is remembered, and a reply is never polled for: a greenlet that spins on its
    connection keeps every other greenlet of its thread from running."""

    def __init__(self, client: redis.Redis, *args: Any, **kwargs: Any) -> None:
        super().__init__(client, *args, **kwargs)
        self._busy_poll = 0.0
        self._threads = _Held()
        self._green = _Pool(connection_cap(self._pool))

    def poll_for(self, seconds: float) -> None:
        """Never: a greenlet does not poll."""

    @property
    def _local(self) -> ConnectionState:
        local = self._threads.local
        if local is None:  # (a bug of ours: it would open a connection outside the pool)
            raise RuntimeError("a dedup connection used outside a check-out")
        return local

    def _checked_out(self, call: Callable[[], _T]) -> _T:
        """``call()`` on a connection of the pool (in a call within a call: the one this
        greenlet holds already)."""
        threads = self._threads
        if threads.local is not None:
            return call()
        pool = self._green
        local = self._take(pool)
        threads.local = local
        try:
            return call()
        finally:
            threads.local = None
            self._give_back(pool, local)

    def _take(self, pool: _Pool) -> ConnectionState:
        with pool.given_back:
            if pool.free:
                return pool.free.pop()
            if pool.made < pool.cap:
                pool.made += 1
                return ConnectionState(self._remember_for)
            # All in use: wait for one rather than open more, within the call's budget.
            if not pool.given_back.wait_for(lambda: pool.free, self._budget or None):
                raise redis.ConnectionError(
                    f"no connection to the dedup Redis free within the call budget "
                    f"({self._budget} s; {pool.cap} in use)"
                )
            return pool.free.pop()

    def _give_back(self, pool: _Pool, local: ConnectionState) -> None:
        if pool is not self._green:
            return  # (a forked child's: its parent's connection)
        with pool.given_back:
            pool.free.append(local)
            pool.given_back.notify()

    def _on(self, local: ConnectionState, call: Callable[[], _T]) -> _T:
        """``call()`` on ``local`` (out of the pool or not: its lock, taken by ``call``, keeps
        its use one greenlet's at a time)."""
        threads = self._threads
        mine, threads.local = threads.local, local
        try:
            return call()
        finally:
            threads.local = mine

    def __call__(
        self, script: Script, keys: Sequence[Part], args: Sequence[Part], *, resend: bool = True
    ) -> object:
        call = super().__call__
        return self._checked_out(lambda: call(script, keys, args, resend=resend))

    def call_many(
        self,
        script: Script,
        calls: Sequence[tuple[Sequence[Part], Sequence[Part]]],
        *,
        resend: bool = True,
    ) -> list[object]:
        call_many = super().call_many
        return self._checked_out(lambda: call_many(script, calls, resend=resend))

    def send(
        self, script: Script, keys: Sequence[Part], args: Sequence[Part], *, reply: bool = False
    ) -> Reply | None:
        """A kept reply is read on the connection it was sent on, which goes back to the pool
        meanwhile: whoever uses it next reads the reply first, or :meth:`result` does."""
        send = super().send

        def sent() -> Reply | None:
            slot = send(script, keys, args, reply=reply)
            if slot is not None:
                slot.on = self._local
            return slot

        return self._checked_out(sent)

    def result(self, slot: Reply) -> object:
        result = super().result
        return self._on(slot.on, lambda: result(slot))

    def flush(self, *, wait: bool = True) -> None:
        """Land what every connection owes: this greenlet's sends are on connections that
        went back to the pool (others' sends are landed with them)."""
        with self._owing_lock:
            owing = list(self._owing)
        flush = super().flush
        for local in owing:
            # (Without waiting, a connection in another greenlet's call is left to it.)
            if not local.lock.acquire(blocking=wait):
                continue
            try:
                self._on(local, lambda: flush(wait=wait))
            finally:
                local.lock.release()

    def _after_fork(self) -> None:
        super()._after_fork()
        self._green = _Pool(self._green.cap)
