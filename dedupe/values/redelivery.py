"""When would the broker deliver a run's message again if its whole worker died?

A run of an ``acks_late`` task holds an unacknowledged message: if the worker dies (SIGKILL,
OOM killer, a lost node) the broker gives it back, and the key must stay with it until it runs
again, or a new call is accepted beside it. The lease (liveness) stays short; the running
record lives for the redelivery horizon, by broker (the table is in the design notes:
docs/design-notes.md, "dedupe.values.redelivery").
"""

from __future__ import annotations

from collections.abc import Iterable

from celery import Celery

__all__ = ["horizon", "redis_redelivery", "redis_visibility", "visibility_gap"]

# kombu's Redis transport defaults (kombu.transport.redis.Channel): an unacked message is
# restored by a sweep every unacked_restore_interval x unacked_restore_throttle seconds, once
# it is older than visibility_timeout.
_VISIBILITY_TIMEOUT = 3600.0
_RESTORE_INTERVAL = 10.0
_RESTORE_THROTTLE = 10


def horizon(redelivery: float | None, lease: float, ttl: float) -> float:
    """Seconds a dead ``acks_late`` run's record must outlive its last renewal;
    ``redelivery``: :func:`redis_redelivery` on a Redis broker, else None."""
    if redelivery is None:
        return max(ttl, lease)
    return redelivery + lease


def redis_visibility(app: Celery) -> float:
    """Seconds after its delivery at least until the Redis broker gives an unacked message
    back (its ``visibility_timeout``)."""
    options = app.conf.broker_transport_options or {}
    return float(options.get("visibility_timeout") or _VISIBILITY_TIMEOUT)


def redis_redelivery(app: Celery) -> float:
    """Seconds after its delivery at most until the Redis broker gives an unacked message
    back (the delivery was before the run's last renewal)."""
    options = app.conf.broker_transport_options or {}
    visibility = redis_visibility(app)
    interval = float(options.get("unacked_restore_interval") or _RESTORE_INTERVAL)
    throttle = int(options.get("unacked_restore_throttle") or _RESTORE_THROTTLE)
    return visibility + interval * max(throttle, 1)


def visibility_gap(redelivery: float, tasks: Iterable[tuple[str, float]]) -> str | None:
    """A start-up warning for ``acks_late`` tasks (name, lease) on a Redis broker that gives
    an unacked message back ``redelivery`` seconds after its delivery: a worker killed while
    running one leaves its key held, and the message unrun, until then, far beyond the
    lease."""
    gapped = [name for name, lease in sorted(tasks) if redelivery > lease]
    if not gapped:
        return None
    return (
        f"acks_late tasks on the Redis broker ({', '.join(gapped)}): if a worker dies while "
        f"running one, the broker gives the message back only after visibility_timeout "
        f"(plus kombu's restore sweep: {redelivery:.0f} s in all), and its key stays held "
        f"until then, so calls meanwhile are duplicates of a task that is not running. "
        f"Lower broker_transport_options['visibility_timeout'] (keep it above your longest "
        f"run and eta) to shorten the wait."
    )
