"""Flow control per key: ``key_concurrency`` and ``key_rate_limit``, their values and the
message header that carries a limited call's key and limit to its run.

Pure values, no I/O: the Redis side is ``dedupe/store/lua/ticket.lua`` (a call's place in
line), ``slot.lua`` / ``renew_slot.lua`` / ``free_slot.lua`` (a run's slot, a lease),
``start.lua`` (the schedule of a key's starts) and ``slot_start.lua`` (both limits).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, cast

from dedupe.errors import ConfigurationError

__all__ = [
    "LIMIT",
    "LIMIT_KEY_NAMES",
    "LINE_KEY_NAMES",
    "LimitHeader",
    "Rate",
    "check_concurrency",
    "come_back",
    "concurrency_of",
    "index_member",
    "limit_keys",
    "line_index",
    "lines_index",
    "parse_rate",
]

#: The header of a limited call's message: ``"<kind>|<limit>|<period>|<lease>|<key>"``; for
#: both limits, ``<limit>`` is ``"<runs at once>/<starts per period>"``.
LIMIT = "celery_dedupe_limit"

#: Celery's ``rate_limit`` units (``celery.utils.time.rate``): seconds per unit.
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class Rate:
    """``key_rate_limit``: at most ``count`` starts of one key in any ``period`` seconds.

    >>> parse_rate("2/s", "t")
    Rate(count=2, period=1.0)
    >>> parse_rate("10/m", "t")
    Rate(count=10, period=60.0)
    """

    count: int
    period: float


def come_back(ahead: int, limit: int, turn: float, cap: float) -> float:
    """Seconds until the ``ahead``-th waiting run of a key with ``limit`` slots is asked
    back: a ``turn`` for every ``limit`` runs ahead of it (the line moves ``limit`` places a
    run), ``cap`` at most. slot.lua keeps its place that long and a lease (the same rule,
    ``come_back`` in its prelude): a place that lapsed sooner would send the run to the back
    of the line on its return.

    >>> come_back(5, 2, 0.5, 30.0)
    1.5
    """
    return min(turn * math.ceil(ahead / max(limit, 1)), cap)


def parse_rate(value: object, task_name: str) -> Rate:
    """Read a ``key_rate_limit`` as Celery reads ``rate_limit``: ``"N/s"``, ``"N/m"``,
    ``"N/h"``, or a number (per second). N must be a whole number of starts, 1 or more."""
    where = f"task {task_name!r}: key_rate_limit"
    if isinstance(value, bool):
        raise ConfigurationError(f'{where} must look like "2/s", "10/m" or "100/h"; got {value!r}')
    if isinstance(value, (int, float)):
        count_text, unit = repr(value), "s"
    elif isinstance(value, str):
        count_text, _, unit = value.strip().partition("/")
        unit = unit or "s"
    else:
        raise ConfigurationError(f'{where} must look like "2/s", "10/m" or "100/h"; got {value!r}')
    try:
        count = float(count_text)
    except ValueError:
        count = math.nan
    if unit not in _UNITS or not (count >= 1 and count == int(count) and count < 2**31):
        raise ConfigurationError(
            f'{where} must be "<N>/s", "<N>/m" or "<N>/h" (Celery\'s rate_limit syntax) with '
            f'N a whole number of starts, 1 or more, such as "2/s"; got {value!r}'
        )
    return Rate(int(count), _UNITS[unit])


def check_concurrency(value: object, task_name: str) -> int | Callable[..., object]:
    """A ``key_concurrency`` as declared: a whole number, 1 or more, or a callable of the
    call's arguments that returns one (checked at each call: :func:`concurrency_of`)."""
    if callable(value):
        return cast("Callable[..., object]", value)
    return _whole(value, task_name)


def concurrency_of(
    value: int | Callable[..., object],
    task_name: str,
    args: Sequence[object] | None,
    kwargs: Mapping[str, object] | None,
) -> int:
    """The limit of one call: ``value``, or what the callable returns for its arguments."""
    if callable(value):
        return _whole(value(*(args or ()), **(kwargs or {})), task_name, called=True)
    return value


def _whole(value: object, task_name: str, *, called: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        source = "the key_concurrency callable returned" if called else "got"
        raise ConfigurationError(
            f"task {task_name!r}: key_concurrency must be a whole number of runs, 1 or more "
            f"(or a callable of the call's arguments returning one); {source} {value!r}"
        )
    return value


#: The keys of one limited key, each named ``<call key>:<name>``.
LIMIT_KEY_NAMES = ("slots", "line", "due", "seq", "starts", "plan", "held", "started")

#: The keys of a key_concurrency line, in the order its scripts take them (KEYS[1..7]);
#: "index" is the index of the prefix's lines (:func:`line_index`).
LINE_KEY_NAMES = ("slots", "line", "held", "seq", "started", "index", "due")


def limit_keys(base: str) -> dict[str, str]:
    """The keys of one limited key (all in ``base``'s hash tag).

    >>> limit_keys("dedupe:{t:ab}")["slots"]
    'dedupe:{t:ab}:slots'
    """
    return {name: f"{base}:{name}" for name in LIMIT_KEY_NAMES}


def lines_index(prefix: str) -> str:
    """The index of the lines of a key prefix that have calls waiting or handed (the
    workers' look at lapsed slots reads it).

    >>> lines_index("dedupe")
    'dedupe:lines'
    """
    return f"{prefix}:lines"


def line_index(base: str) -> str:
    """The index of the lines of ``base``'s key prefix (:func:`lines_index`).

    >>> line_index("dedupe:{t:ab}")
    'dedupe:lines'
    """
    return lines_index(base[: base.index(":{")] if ":{" in base else base)


def index_member(limit: int, lease_ms: int, base: str) -> str:
    """A line's member in its index: what a look at it needs (its limit, lease and key).

    >>> index_member(2, 60000, "dedupe:{t:ab}")
    '2|60000|dedupe:{t:ab}'
    """
    return f"{limit}|{lease_ms}|{base}"


_KINDS: dict[str, Literal["concurrency", "rate", "both"]] = {
    "concurrency": "concurrency",
    "rate": "rate",
    "both": "both",
}


@dataclass(frozen=True, slots=True)
class LimitHeader:
    """What a limited call's message tells its run: the key, the kind and size of the limit,
    the slot's lease. Decided once, by the producer (a callable limit is called there).

    >>> header = LimitHeader("concurrency", "dedupe:{t:ab}", 2, 0.0, 60.0)
    >>> LimitHeader.read({LIMIT: header.encode()}) == header
    True
    >>> both = LimitHeader("both", "dedupe:{t:ab}", 1, 1.0, 60.0, starts=2)
    >>> both.encode()
    'both|1/2|1.0|60.0|dedupe:{t:ab}'
    >>> LimitHeader.read({LIMIT: both.encode()}) == both
    True
    """

    kind: Literal["concurrency", "rate", "both"]
    key: str
    #: Runs at once (concurrency, both), or starts per period (rate).
    limit: int
    #: Seconds of the rate's period (0 for concurrency).
    period: float
    #: Seconds a slot is held between heartbeats (concurrency, both).
    lease: float
    #: Starts per period (both; 0 otherwise).
    starts: int = 0

    def encode(self) -> str:
        limit = f"{self.limit}/{self.starts}" if self.kind == "both" else str(self.limit)
        return f"{self.kind}|{limit}|{self.period!r}|{self.lease!r}|{self.key}"

    @property
    def holds_slots(self) -> bool:
        """Does a run of this header hold a slot (a place in line before it)?"""
        return self.kind != "rate"

    @classmethod
    def read(cls, headers: Mapping[str, object] | None) -> LimitHeader | None:
        """The header in a message's headers, or None (not a limited call's message)."""
        raw = (headers or {}).get(LIMIT)
        if not isinstance(raw, str):
            return None
        parts = raw.split("|", 4)
        if len(parts) != 5 or parts[0] not in _KINDS or not parts[4]:
            return None
        limit_text, _, starts_text = parts[1].partition("/")
        if (parts[0] == "both") != bool(starts_text):
            return None
        try:
            limit, period, lease = int(limit_text), float(parts[2]), float(parts[3])
            starts = int(starts_text) if starts_text else 0
        except ValueError:
            return None
        return cls(_KINDS[parts[0]], parts[4], limit, period, lease, starts)

    @property
    def keys(self) -> dict[str, str]:
        return limit_keys(self.key)
