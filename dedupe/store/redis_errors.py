"""Which of redis-py's errors mean "Redis cannot answer now" (:class:`~dedupe.RedisUnavailable`)
and which a refusal (:class:`~dedupe.RedisCommandError`): one classification for every round
trip of the store."""

from __future__ import annotations

import re
from types import TracebackType

import redis
import redis.cluster

from dedupe.errors import RedisCommandError, RedisUnavailable

from .cluster_runner import cluster_unreachable
from .script_runner import Unanswered

__all__ = ["redis_errors", "reraise_unavailable"]

#: What counts as "Redis is unreachable": connection and timeout failures, a server still
#: loading its data, a replica that refuses writes after a failover, a server at its memory
#: limit under noeviction (the policy the README recommends) refusing writes.
redis_errors: tuple[type[BaseException], ...] = (
    Unanswered,  # (its fate unknown: a publish of unknown fate, reported as unavailable)
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.OutOfMemoryError,
    # (Not in every redis-py 5: a missing one is an ordinary ResponseError, matched by text.)
    *(
        getattr(redis.exceptions, name)
        for name in ("TryAgainError", "MasterDownError")
        if hasattr(redis.exceptions, name)
    ),
)


# Replies that mean "not now" rather than "never": a script over its time limit (BUSY), a
# server that cannot persist (MISCONF) or is out of memory, loading, a replica after a
# failover, a cluster in flux. Inside a script Redis may wrap them in a script error, so they
# are matched in the text too.
_NOT_NOW = re.compile(
    r"(?:^|[\s:-])(BUSY|MISCONF|OOM|LOADING|READONLY|NOREPLICAS|MASTERDOWN|TRYAGAIN|CLUSTERDOWN)\s"
)


class reraise_unavailable:
    """Re-raise "Redis is unreachable" errors as :class:`RedisUnavailable`.

    A class, not a generator context manager: it wraps every round trip, and costs a
    fraction of one.
    """

    __slots__ = ("key", "operation")

    def __init__(self, operation: str, key: str | None = None) -> None:
        self.operation = operation
        self.key = key

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        if (
            isinstance(exc, redis_errors)
            or (isinstance(exc, redis.ResponseError) and _NOT_NOW.search(str(exc)))
            or cluster_unreachable(exc)
        ):
            raise RedisUnavailable(self.operation, exc) from exc
        if isinstance(exc, (redis.RedisError, redis.exceptions.RedisClusterException)):
            raise RedisCommandError(self.operation, self.key, exc) from exc
