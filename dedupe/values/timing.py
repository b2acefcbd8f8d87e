"""When a message may run, and durations as Redis takes them.

One reading of ``countdown`` and ``eta`` for the producer, the worker and the prefork parent,
as Celery reads them: a naive ``eta`` is in UTC when ``enable_utc`` is on (Celery's default),
else in local time.
"""

from __future__ import annotations

import datetime as dt

__all__ = ["delay_seconds", "milliseconds", "seconds_to_expiry", "seconds_until"]


def delay_seconds(
    countdown: float | None, eta: object, now: float, *, enable_utc: bool = True
) -> float:
    """Seconds from ``now`` until a message may run: its countdown, else its eta.

    >>> delay_seconds(30, None, 0.0)
    30.0
    >>> delay_seconds(None, "1970-01-01T00:01:00+00:00", 0.0)
    60.0
    >>> delay_seconds(None, None, 0.0)
    0.0
    """
    if countdown:
        return max(float(countdown), 0.0)
    return seconds_until(eta, now, enable_utc=enable_utc)


def seconds_until(eta: object, now: float, *, enable_utc: bool = True) -> float:
    """Seconds from ``now`` until ``eta`` (a datetime or its ISO text), 0 if past or none.

    >>> seconds_until(dt.datetime(1970, 1, 1, 0, 0, 5), 0.0)   # naive: UTC
    5.0
    >>> seconds_until("not a date", 0.0)
    0.0
    """
    if not eta:
        return 0.0
    if isinstance(eta, str):
        try:
            eta = dt.datetime.fromisoformat(eta)
        except ValueError:
            return 0.0  # Celery will refuse it when the message arrives
    if not isinstance(eta, dt.datetime):
        return 0.0
    if eta.tzinfo is None:
        eta = eta.replace(tzinfo=dt.timezone.utc) if enable_utc else eta.astimezone()
    return max(float(eta.timestamp()) - now, 0.0)


def seconds_to_expiry(expires: object, now: float, *, enable_utc: bool = True) -> float | None:
    """Seconds from ``now`` until a message with Celery's ``expires`` option expires (0 if it
    has), or None when it never does.

    >>> seconds_to_expiry(500, 0.0), seconds_to_expiry(None, 0.0)
    (500.0, None)
    >>> seconds_to_expiry("1970-01-01T00:01:00+00:00", 0.0)
    60.0
    """
    if expires is None:
        return None
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):
        return max(float(expires), 0.0)
    if isinstance(expires, str):
        try:
            dt.datetime.fromisoformat(expires)
        except ValueError:
            return None  # not a time Celery can read either
    return seconds_until(expires, now, enable_utc=enable_utc)


def milliseconds(seconds: float) -> int:
    """A duration as Redis's PX and PEXPIRE take it: whole milliseconds, at least 1.

    >>> milliseconds(1.5), milliseconds(0)
    (1500, 1)
    """
    return max(int(seconds * 1000), 1)
