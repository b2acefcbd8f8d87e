"""App-wide settings, read once from ``app.conf`` into a :class:`DedupeConfig`.

=========================  ===========================================  =====================
setting                    meaning                                      default
=========================  ===========================================  =====================
dedupe_redis_url           the Redis that holds the records             the broker URL, when
                                                                        it is a Redis URL
dedupe_redis_options       extra ``redis.Redis.from_url`` arguments     short timeouts, 2
                                                                        retries
dedupe_key_prefix          first part of every key                      ``"dedupe"``
dedupe_default_ttl         seconds a queued record lives (+ countdown)  3600
dedupe_default_lease       seconds a run's lease lasts between beats    60
dedupe_on_redis_error      ``"enqueue"`` (publish anyway, log) or       ``"enqueue"``
                           ``"raise"`` (:class:`RedisUnavailable`)
dedupe_busy_poll_us        microseconds to poll for a Redis reply       100
                           before sleeping for it (0: never poll)
=========================  ===========================================  =====================

Django projects that load settings with ``namespace="CELERY"`` spell them
``CELERY_DEDUPE_REDIS_URL`` and so on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from celery import Celery

from .errors import ConfigurationError

__all__ = ["BUSY_POLL", "DedupeConfig"]

#: Seconds to poll for a Redis reply before sleeping for it (see dedupe.script_runner).
BUSY_POLL = 100e-6

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
_ON_REDIS_ERROR = ("enqueue", "raise")


@dataclass(frozen=True)
class DedupeConfig:
    """The validated settings of one app."""

    redis_url: str
    redis_options: Mapping[str, Any] = field(default_factory=dict)
    key_prefix: str = "dedupe"
    default_ttl: float = 3600.0
    default_lease: float = 60.0
    on_redis_error: Literal["enqueue", "raise"] = "enqueue"
    busy_poll: float = BUSY_POLL

    @classmethod
    def from_app(cls, app: Celery) -> DedupeConfig:
        conf = app.conf
        redis_url = _setting(conf, "dedupe_redis_url") or _redis_url_of_broker(app)
        prefix = _setting(conf, "dedupe_key_prefix", "dedupe")
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise ConfigurationError(
                f"dedupe_key_prefix must be a non-empty string without braces (braces are "
                f"the Redis Cluster hash tag of each key); got {prefix!r}"
            )
        options = _setting(conf, "dedupe_redis_options", {})
        if not isinstance(options, Mapping):
            raise ConfigurationError(
                f"dedupe_redis_options must be a mapping of redis.Redis.from_url arguments; "
                f"got {options!r}"
            )
        on_error = _setting(conf, "dedupe_on_redis_error", "enqueue")
        if on_error not in _ON_REDIS_ERROR:
            raise ConfigurationError(
                f"dedupe_on_redis_error must be 'enqueue' (publish anyway and log) or "
                f"'raise'; got {on_error!r}"
            )
        return cls(
            redis_url=redis_url,
            redis_options=dict(options),
            key_prefix=prefix,
            default_ttl=positive_seconds(
                "dedupe_default_ttl", _setting(conf, "dedupe_default_ttl", 3600)
            ),
            default_lease=positive_seconds(
                "dedupe_default_lease", _setting(conf, "dedupe_default_lease", 60)
            ),
            on_redis_error=cast('Literal["enqueue", "raise"]', on_error),
            busy_poll=_busy_poll(_setting(conf, "dedupe_busy_poll_us", BUSY_POLL * 1e6)),
        )


def positive_seconds(name: str, value: Any) -> float:
    """Validate a duration setting or option."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigurationError(f"{name} must be a positive number of seconds; got {value!r}")
    return float(value)


def _busy_poll(micros: Any) -> float:
    if isinstance(micros, bool) or not isinstance(micros, (int, float)) or not micros >= 0:
        raise ConfigurationError(
            f"dedupe_busy_poll_us must be a number of microseconds, 0 or more (0: never "
            f"poll); got {micros!r}"
        )
    return float(micros) / 1e6


def _setting(conf: Any, name: str, default: Any = None) -> Any:
    # Django's namespace="CELERY" loading keeps unknown settings upper-case.
    value = conf.get(name)
    if value is None:
        value = conf.get(name.upper())
    return default if value is None else value


def _redis_url_of_broker(app: Celery) -> str:
    broker = app.conf.broker_url or ""
    if isinstance(broker, str):
        for url in broker.split(";"):
            url = url.strip()
            if url.startswith("redis+socket://"):
                return "unix://" + url[len("redis+socket://") :]
            if url.startswith(_REDIS_SCHEMES):
                return url
    raise ConfigurationError(
        f"celery-dedupe needs a Redis server and the broker of app {app.main!r} is not one "
        f"({_redact(broker)!r}): set app.conf.dedupe_redis_url = 'redis://host:6379/0'"
    )


def _redact(url: Any) -> str:
    text = str(url)
    if "@" in text and "://" in text:
        scheme, rest = text.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return text
