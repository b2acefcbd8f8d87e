"""App-wide settings, read once from ``app.conf`` into a :class:`DedupeConfig`.

Design notes: docs/design-notes.md, "dedupe.values.config".
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast
from urllib.parse import parse_qs, urlsplit

import redis
import redis.cluster
import redis.connection
from celery import Celery
from celery.utils.collections import ConfigurationView

from dedupe.compat.celery_private import setting_keys
from dedupe.errors import ConfigurationError

from . import defaults
from .catalog import SETTING_PREFIX, SETTINGS
from .urls import CLUSTER_SCHEMES, SENTINEL_OPTIONS, SENTINEL_SCHEMES, redacted

__all__ = ["MOST_SECONDS", "URL_SCHEMES", "DedupeConfig", "SettingReader", "positive_seconds"]

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
_ON_REDIS_ERROR = ("enqueue", "raise")


@dataclass(frozen=True)
class DedupeConfig:
    """The validated settings of one app."""

    redis_url: str
    redis_options: Mapping[str, Any] = field(default_factory=dict)
    key_prefix: str = defaults.KEY_PREFIX
    default_ttl: float = defaults.TTL
    default_lease: float = defaults.LEASE
    on_redis_error: Literal["enqueue", "raise"] = defaults.ON_REDIS_ERROR
    #: Seconds to poll for a Redis reply before sleeping for it (see dedupe.store.script_runner).
    busy_poll: float = defaults.BUSY_POLL_US / 1e6
    #: The same in a prefork pool's process: the setting if it is given, else none (the pool's
    #: processes keep every core busy, and a spin takes a sibling's or Redis's CPU).
    busy_poll_in_pool: float = 0.0
    provisional_ttl: float = defaults.PROVISIONAL_TTL
    #: Seconds a thread may answer a repeated duplicate from memory (0: never).
    remember_duplicates: float = defaults.REMEMBER_DUPLICATES
    call_budget: float = defaults.CALL_BUDGET
    deferral_cap: float = defaults.DEFERRAL_CAP
    max_deferrals: int = defaults.MAX_DEFERRALS
    #: Seconds between two reaper passes (0: no reaper; see dedupe.runs.reaping).
    reap_interval: float = defaults.REAP_INTERVAL
    reap_margin: float = defaults.REAP_MARGIN
    #: The bearer token ``celery dedupe web`` asks of every request (None: none asked).
    web_token: str | None = None
    #: ``(user, password)`` that ``celery dedupe web`` asks by basic auth (None: none asked).
    web_basic_auth: tuple[str, str] | None = None
    #: Does this process keep its events for a running web view (a thread looks for one)?
    web_events: bool = False

    @classmethod
    def from_app(cls, app: Celery) -> DedupeConfig:
        conf = app.conf
        _check_setting_names(conf, getattr(app, "namespace", None))  # (untyped in celery-types)
        own_url = _setting(conf, "dedupe_redis_url")
        if own_url is not None:
            _check_url(own_url)
        redis_url = cast("str | None", own_url) or _redis_url_of_broker(app)  # (checked)
        prefix = _setting(conf, "dedupe_key_prefix", defaults.KEY_PREFIX)
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
        _refuse_decoding(redis_url, options)
        _check_redis_options(redis_url, options)
        if not own_url and redis_url.startswith(SENTINEL_SCHEMES):
            # The broker's Sentinel: its master name and sentinel settings are the store's.
            transport = conf.get("broker_transport_options") or {}
            options = {
                **{k: transport[k] for k in ("master_name", "sentinel_kwargs") if k in transport},
                **options,
            }
        # Given or not: a prefork pool's process polls only if it is given.
        busy_poll = _setting(conf, "dedupe_busy_poll_us")
        on_error = _setting(conf, "dedupe_on_redis_error", defaults.ON_REDIS_ERROR)
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
                "dedupe_default_ttl", _setting(conf, "dedupe_default_ttl", defaults.TTL)
            ),
            default_lease=positive_seconds(
                "dedupe_default_lease", _setting(conf, "dedupe_default_lease", defaults.LEASE)
            ),
            on_redis_error=cast('Literal["enqueue", "raise"]', on_error),
            busy_poll=_busy_poll(defaults.BUSY_POLL_US if busy_poll is None else busy_poll),
            busy_poll_in_pool=0.0 if busy_poll is None else _busy_poll(busy_poll),
            call_budget=_seconds_or_never(
                "dedupe_call_budget", _setting(conf, "dedupe_call_budget", defaults.CALL_BUDGET)
            ),
            provisional_ttl=positive_seconds(
                "dedupe_provisional_ttl",
                _setting(conf, "dedupe_provisional_ttl", defaults.PROVISIONAL_TTL),
            ),
            remember_duplicates=_seconds_or_never(
                "dedupe_remember_duplicates",
                _setting(conf, "dedupe_remember_duplicates", defaults.REMEMBER_DUPLICATES),
            ),
            deferral_cap=positive_seconds(
                "dedupe_deferral_cap",
                _setting(conf, "dedupe_deferral_cap", defaults.DEFERRAL_CAP),
            ),
            max_deferrals=_count(
                "dedupe_max_deferrals",
                _setting(conf, "dedupe_max_deferrals", defaults.MAX_DEFERRALS),
            ),
            reap_interval=_seconds_or_never(
                "dedupe_reap_interval",
                _setting(conf, "dedupe_reap_interval", defaults.REAP_INTERVAL),
            ),
            reap_margin=positive_seconds(
                "dedupe_reap_margin", _setting(conf, "dedupe_reap_margin", defaults.REAP_MARGIN)
            ),
            web_token=_web_token(_setting(conf, "dedupe_web_token")),
            web_basic_auth=_web_basic_auth(_setting(conf, "dedupe_web_basic_auth")),
            web_events=_flag("dedupe_web_events", _setting(conf, "dedupe_web_events", False)),
        )


#: The longest duration a setting or option may give: Redis takes expiries in whole
#: milliseconds up to 2**63, and the scripts compute with doubles; a hundred years is room.
MOST_SECONDS = 100 * 365 * 24 * 3600


def positive_seconds(name: str, value: object) -> float:
    """Validate a duration setting or option."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigurationError(f"{name} must be a positive number of seconds; got {value!r}")
    if not value <= MOST_SECONDS:  # (infinity and NaN included)
        raise ConfigurationError(
            f"{name} must be at most {MOST_SECONDS:,} seconds (100 years); got {value!r}"
        )
    return float(value)


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be a whole number, 1 or more; got {value!r}")
    return value


def _flag(name: str, value: object) -> bool:
    """A setting that is True or False.

    >>> _flag("dedupe_web_events", True)
    True
    """
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False; got {value!r}")
    return value


def _web_token(token: object) -> str | None:
    if token is None:
        return None
    # (A short token is guessed: the view may clear keys.)
    if not isinstance(token, str) or len(token) < 16 or token != token.strip():
        raise ConfigurationError(
            "dedupe_web_token must be a string of 16 characters or more, without spaces "
            "around it (such as secrets.token_urlsafe()); got "
            + (f"{len(token)} characters" if isinstance(token, str) else type(token).__name__)
        )
    return token


def _web_basic_auth(value: object) -> tuple[str, str] | None:
    if value is None:
        return None
    user, colon, password = value.partition(":") if isinstance(value, str) else ("", "", "")
    if not (user and colon and password):
        # (Never the value itself in the message: it holds a password.)
        raise ConfigurationError(
            "dedupe_web_basic_auth must be a string 'user:password', both parts non-empty"
        )
    return user, password


def _seconds_or_never(name: str, seconds: object) -> float:
    if seconds == 0 and not isinstance(seconds, bool):
        return 0.0
    return positive_seconds(name, seconds)


def _busy_poll(micros: object) -> float:
    if isinstance(micros, bool) or not isinstance(micros, (int, float)) or not micros >= 0:
        raise ConfigurationError(
            f"dedupe_busy_poll_us must be a number of microseconds, 0 or more (0: never "
            f"poll); got {micros!r}"
        )
    return float(micros) / 1e6


def _refuse_decoding(url: str, options: Mapping[str, object]) -> None:
    # Records and keys are binary (msgpack): a client that decodes replies as text fails on
    # every read (lookups, the CLI, the pool parent's revoke handler) long after start-up.
    query = parse_qs(urlsplit(url).query)
    in_url = query.get("decode_responses", ["false"])[-1].lower() not in ("", "0", "false", "no")
    if options.get("decode_responses") or in_url:
        where = "dedupe_redis_options" if options.get("decode_responses") else "the Redis URL"
        raise ConfigurationError(
            f"decode_responses=True in {where} cannot work for the dedup store: its records "
            f"are binary, and every read would fail. Leave it out: the dedup client is "
            f"celery-dedupe's own, and your other Redis clients keep their settings"
        )


#: The name of every setting of celery-dedupe.
_SETTING_NAMES = tuple(setting.name for setting in SETTINGS)


def _check_setting_names(conf: Mapping[str, object], namespace: str | None) -> None:
    """Refuse a setting named as celery-dedupe's are that is none of them: a misspelt one
    would be ignored, and its default used without a word. The nearest name is suggested."""
    prefix = namespace.rstrip("_") + "_" if namespace else ""
    keys: list[object] = list(conf.keys())  # (a plain dict's may be of any type)
    for key in keys:
        if not isinstance(key, str):
            continue
        if prefix and key.upper().startswith(prefix.upper()):
            written = key[len(prefix) :]
        elif prefix and key.isupper():
            # Django's namespace="CELERY" loading: an upper-case name outside the namespace
            # is a setting of the project's own (maybe another library's DEDUPE_*).
            continue
        else:
            written = key
        name = written.lower()
        if not name.startswith(SETTING_PREFIX) or name in _SETTING_NAMES:
            continue
        # (Compared without the shared prefix, which would make any two names look alike.)
        bare = [known[len(SETTING_PREFIX) :] for known in _SETTING_NAMES]
        nearest = difflib.get_close_matches(name[len(SETTING_PREFIX) :], bare, n=1, cutoff=0.6)
        if nearest:
            spelled = SETTING_PREFIX + nearest[0]
            spelled = spelled.upper() if written.isupper() else spelled
            hint = f"did you mean {key[: len(key) - len(written)]}{spelled}?"
        else:
            hint = f"its settings are {', '.join(_SETTING_NAMES)}"
        raise ConfigurationError(f"{key} is not a setting of celery-dedupe; {hint}")


def _setting(conf: Mapping[str, object], name: str, default: object = None) -> object:
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
            if url.startswith(SENTINEL_SCHEMES):
                return broker  # every sentinel of the list
    raise ConfigurationError(
        f"celery-dedupe needs a Redis server and the broker of app {app.main!r} is not one "
        f"({redacted(broker)!r}): set app.conf.dedupe_redis_url = 'redis://host:6379/0'"
    )


# Reading a Celery setting on the hot path of every call.
#
# ``app.conf["task_always_eager"]`` costs a producer call as much as the rest of deciding it:
# Celery's settings view spells the name every way it may be written (old and new names, the
# namespace prefix) anew on each read, and raises and catches a KeyError for each mapping
# that does not hold it (most apps set it nowhere, so it is found only in the defaults).
# :class:`SettingReader` spells the name once per settings object, then looks it up in the
# same mappings, in the same order, without raising: the same answer, several times cheaper.


class SettingReader:
    """Reads one setting of an app as ``app.conf[name]`` would.

    >>> always_eager = SettingReader("task_always_eager")
    >>> always_eager(Celery("doc", set_as_current=False))
    False
    """

    __slots__ = ("_name", "_spelled")

    def __init__(self, name: str) -> None:
        self._name = name
        #: (the settings object, the keys its view looks the name up under), cached together
        #: so that threads never see one without the other.
        self._spelled: tuple[object, tuple[str, ...]] | None = None

    def __call__(self, app: Celery) -> Any:
        conf: Any = app.conf  # a PendingConfiguration until the app is finalized
        spelled = self._spelled
        if spelled is None or spelled[0] is not conf:
            if not isinstance(conf, ConfigurationView):
                # Not finalized yet: the plain read finalizes it.
                return conf[self._name]
            spelled = self._spelled = (conf, self._spell(conf))
        keys = spelled[1]
        for mapping in conf.maps:
            for key in keys:
                if key in mapping:
                    return mapping[key]
        return conf[self._name]  # found nowhere: let Celery answer (or raise) as it would

    def _spell(self, conf: ConfigurationView) -> tuple[str, ...]:
        # The keys ConfigurationView.__getitem__ tries, in its order; none: the plain read.
        return setting_keys(conf, self._name)


#: Every URL scheme the dedup store takes.
URL_SCHEMES = (*_REDIS_SCHEMES, *SENTINEL_SCHEMES, *CLUSTER_SCHEMES)


def _check_url(url: object) -> None:
    if not isinstance(url, str) or not url.startswith(URL_SCHEMES):
        got = repr(redacted(url)) if isinstance(url, str) else f"{url!r} ({type(url).__name__})"
        raise ConfigurationError(
            f"dedupe_redis_url must be a Redis URL starting with one of {', '.join(URL_SCHEMES)} "
            f"(such as 'redis://localhost:6379/0'); got {got}"
        )


#: Options of the dedup store's client taken as numbers (seconds, counts): a string or a
#: bool there fails deep inside redis-py, at the first call.
_NUMBERS = (
    "socket_timeout",
    "socket_connect_timeout",
    "health_check_interval",
    "max_connections",
    "db",
    "port",
)


def _check_redis_options(url: str, options: Mapping[str, object]) -> None:
    allowed = _client_arguments(cluster=url.startswith(CLUSTER_SCHEMES))
    for name, value in options.items():
        if name not in allowed:
            nearest = difflib.get_close_matches(str(name), allowed, n=1, cutoff=0.6)
            hint = f"did you mean {nearest[0]!r}?" if nearest else "see redis.Redis's arguments"
            raise ConfigurationError(
                f"dedupe_redis_options: {name!r} is not an argument of the dedup store's "
                f"Redis client; {hint}"
            )
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if name in _NUMBERS and value is not None and not number:
            raise ConfigurationError(
                f"dedupe_redis_options: {name} must be a number; got {value!r} "
                f"({type(value).__name__})"
            )


@functools.cache
def _client_arguments(*, cluster: bool) -> frozenset[str]:
    """What redis-py's client and connections take as keyword arguments (a Cluster's client
    too, for a Cluster URL), and the Sentinel lookup's own options."""
    takers: list[Callable[..., object]] = [
        redis.Redis.__init__,
        redis.connection.AbstractConnection.__init__,
        redis.connection.Connection.__init__,
        redis.connection.SSLConnection.__init__,
        redis.connection.UnixDomainSocketConnection.__init__,
    ]
    if cluster:
        takers.append(redis.cluster.RedisCluster.__init__)
    names = {
        name
        for taker in takers
        for name, parameter in inspect.signature(taker).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
        or parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    }
    return frozenset(names - {"self"}) | frozenset(SENTINEL_OPTIONS)
