"""Canonical, type-exact msgpack encoding of call arguments.

Two values encode to the same bytes exactly when a task would see them as the same argument
after Celery's default JSON round trip: tuples and lists alike, dict keys in a fixed order.
Values of different types never share an encoding: ``1``, ``1.0``, ``True`` and ``"1"`` all
differ, and each non-native type Celery's JSON serializer accepts carries its own tag.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

import msgpack

from ._packing import shared_pack

__all__ = ["Unencodable", "canonical_bytes"]

# Ext type codes. They are part of the key format (see keys.KEY_VERSION): never renumber.
_BIG_INT = 1
_DATETIME = 2
_DATE = 3
_TIME = 4
_UUID = 5
_DECIMAL = 6
_SET = 7
_MODEL = 8

_INT64_MIN = -(2**63)
_UINT64_MAX = 2**64 - 1

_pack = shared_pack(use_bin_type=True)


class Unencodable(Exception):
    """A value has no canonical encoding. ``path`` locates it inside the top-level value."""

    def __init__(self, value: Any) -> None:
        super().__init__(type(value).__name__)
        self.value = value
        self.path = ""

    def inside(self, segment: str) -> Unencodable:
        self.path = segment + self.path
        return self


def canonical_bytes(value: Any) -> bytes:
    """Encode ``value`` canonically.

    >>> canonical_bytes((1, "a")) == canonical_bytes([1, "a"])
    True
    >>> canonical_bytes(1) == canonical_bytes(1.0)
    False
    """
    return _pack(_canonical(value))


def _canonical(value: Any) -> Any:
    # Exact type checks first: they cover nearly every real argument at a fraction of the
    # cost of isinstance chains. Subclasses (IntEnum, str enums, OrderedDict, namedtuples)
    # fall through to the isinstance checks below and encode like their base type, as the
    # JSON serializer would send them.
    kind = type(value)
    if kind is str or kind is float or kind is bool or value is None or kind is bytes:
        return value
    if kind is int:
        return value if _INT64_MIN <= value <= _UINT64_MAX else _big_int(value)
    if kind is dict:
        return _map(value)
    if kind is list or kind is tuple:
        return _sequence(value)
    return _other(value)


def _sequence(items: Any) -> tuple[Any, ...]:
    # Tuples, not lists: a canonical sequence may become a dict key (pickle users pass
    # tuple keys) and must stay hashable; msgpack packs both as arrays.
    out = []
    for index, item in enumerate(items):
        try:
            out.append(_canonical(item))
        except Unencodable as exc:
            raise exc.inside(f"[{index}]") from None
    return tuple(out)


def _map(mapping: Mapping[Any, Any]) -> dict[Any, Any]:
    pairs = []
    all_str = True
    for key, item in mapping.items():
        try:
            canonical_key = _canonical(key)
            canonical_item = _canonical(item)
        except Unencodable as exc:
            raise exc.inside(f"[{key!r}]") from None
        all_str = all_str and type(canonical_key) is str
        pairs.append((canonical_key, canonical_item))
    if all_str:
        pairs.sort(key=_first)
    else:
        # Mixed key types have no common order: sort on their encodings instead.
        pairs.sort(key=_packed_first)
    return dict(pairs)


def _first(pair: tuple[Any, Any]) -> Any:
    return pair[0]


def _packed_first(pair: tuple[Any, Any]) -> bytes:
    return _pack(pair[0])


def _big_int(value: int) -> msgpack.ExtType:
    return msgpack.ExtType(_BIG_INT, str(value).encode())


def _tagged(code: int, text: str) -> msgpack.ExtType:
    return msgpack.ExtType(code, text.encode())


# Non-native types Celery's JSON serializer accepts, each with its tag; datetime before date:
# a datetime is a date too.
_TAGGED: tuple[tuple[type, int, Callable[[Any], str]], ...] = (
    (dt.datetime, _DATETIME, dt.datetime.isoformat),
    (dt.date, _DATE, dt.date.isoformat),
    (dt.time, _TIME, dt.time.isoformat),
    (uuid.UUID, _UUID, lambda value: value.hex),
    (Decimal, _DECIMAL, str),
)

# Subclasses of native types (IntEnum, str enums, OrderedDict, namedtuples) encode like their
# base type, as the JSON serializer sends them; bool before int: a bool is an int too.
_AS_BASE: tuple[tuple[type | tuple[type, ...], Callable[[Any], Any]], ...] = (
    (bool, bool),
    (int, lambda value: _canonical(int(value))),
    (float, float),
    (str, str),
    ((bytes, bytearray, memoryview), bytes),
    (Mapping, lambda value: _map(value)),
    ((list, tuple), lambda value: _sequence(value)),
)


def _other(value: Any) -> Any:
    for kind, code, text in _TAGGED:
        if isinstance(value, kind):
            return _tagged(code, text(value))
    for base, convert in _AS_BASE:
        if isinstance(value, base):
            return convert(value)
    if isinstance(value, (set, frozenset)):
        members = sorted(_pack(member) for member in _sequence(value))
        return msgpack.ExtType(_SET, b"".join(members))
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        # A pydantic model (Celery's pydantic=True tasks): its JSON form, tagged with its
        # class so that two models with equal fields but different types stay apart.
        name = f"{type(value).__module__}.{type(value).__qualname__}"
        return msgpack.ExtType(_MODEL, _pack((name, _canonical(dump(mode="json")))))
    raise Unencodable(value)
