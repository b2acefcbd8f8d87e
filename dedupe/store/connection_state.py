"""The state of one connection of a script runner: a thread's own (or, under gevent, one
checked out of a pool), what is in flight on it, and what it remembers."""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from redis.commands.core import Script
from redis.connection import AbstractConnection

from .remembered import RememberedAnswers

if TYPE_CHECKING:
    from .deferred import Reply

__all__ = ["DEFAULT_MAX_CONNECTIONS", "ConnectionState", "Holder", "Threads", "connection_cap"]


#: Connections a runner opens at most when its client's pool has no ``max_connections``
#: (redis-py 8's pools have 100 unless told otherwise; older ones none).
DEFAULT_MAX_CONNECTIONS = 50
# Older redis-py pools stand for "no limit" with this.
_UNLIMITED = 2**31


def connection_cap(pool: Any) -> int:
    """The client pool's ``max_connections`` if it has one, else the default."""
    limit = getattr(pool, "max_connections", None)
    if isinstance(limit, int) and 0 < limit < _UNLIMITED:
        return limit
    return DEFAULT_MAX_CONNECTIONS


class ConnectionState:
    """One thread's connection and what is in flight on it. Only its thread uses it, under
    its ``lock``; the sweeper too, with the lock, once the thread leaves sends unread."""

    connection: AbstractConnection | None = None
    forks: int = -1
    #: Poll for replies before sleeping for them (False: never on this connection).
    poll: bool = False
    #: Looks at the connection's plain socket without a system call more than poll(2): how
    #: a lone reply is polled for (None: a TLS or cooperative socket, or none to be had).
    poller: Any = None
    #: The last command written was the only one owed, and its reply is not read yet.
    lone: bool = False
    #: Calls left before polling again (after a poll that ran out of budget).
    poll_skips: int = 0
    #: Polls in a row that ran out of budget.
    poll_misses: int = 0
    #: When this thread last used its connection (time.monotonic()).
    used_at: float = 0.0
    #: Seconds left of the call's budget, while a retry runs: caps the timeouts of the
    #: connection it opens (None: no retry running).
    cap: float | None = None
    #: The connection was opened with a retry's capped timeouts: replaced once idle.
    capped: bool = False
    #: Redis pushes this connection invalidations of the keys it reads behind CACHING YES.
    tracking: bool = False
    #: NOSCRIPT reloads on this thread (a reloaded call is sent again without CACHING YES).
    reloads: int = 0
    #: Replies owed on ``connection``: one more before each command is written, one less as
    #: each is read. Anything but ``len(pending)`` between calls means an exchange was cut
    #: short (an exception, a signal handler's included, between a send and its read): the
    #: next reply would be taken for another command's, so the connection is dropped.
    owed: int = 0
    #: The current call's command was written: its fate is the server's from then on.
    wrote: bool = False
    #: In the runner's set of connections with sends whose replies are owed.
    owing: bool = False
    #: When the sweeper first failed to land this connection's sends (0: it has not failed).
    failing_since: float = 0.0

    def __init__(self, remember_for: float) -> None:
        self.lock = threading.RLock()
        #: Remembered answers of tracked keys, until Redis says the key changed.
        self.known = RememberedAnswers(remember_for)
        #: Calls sent on ``connection`` whose replies are not read yet, oldest first.
        #: (A script of None: the SCRIPT LOAD of a call sent again after NOSCRIPT.)
        self.pending: deque[tuple[Script | None, bytes, Reply | None]] = deque()
        #: Calls sent on a connection that was lost before their replies came: send again.
        self.unsent: list[tuple[Script | None, bytes, Reply | None]] = []


class Threads(threading.local):
    """Each thread's :class:`ConnectionState`."""

    local: ConnectionState | None = None


class Holder(Protocol):
    """Where each thread finds its connection (:class:`Threads`; green_pool.py's for
    greenlets)."""

    local: ConnectionState | None
