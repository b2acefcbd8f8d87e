"""Canonical, type-exact msgpack encoding of call arguments.

Two values encode to the same bytes exactly when a task would see them as the same argument
after Celery's default JSON round trip: tuples and lists alike, dict keys in a fixed order.
Values of different types never share an encoding: ``1``, ``1.0``, ``True`` and ``"1"`` all
differ, and each non-native type Celery's JSON serializer accepts carries its own tag.

A value either encodes or raises :class:`Unencodable` locating the part at fault: no other
exception escapes (a lone surrogate, a structure that contains itself, a model whose
``model_dump`` fails).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

import msgpack

from .packing import shared_pack

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
_HUGE_INT = 9

_INT64_MIN = -(2**63)
_UINT64_MAX = 2**64 - 1
# Big ints below CPython's default int_max_str_digits (4,300 digits) have been encoded as decimal
# text from the first key version on, and keep that form; larger ones, which str() refuses by
# default, are encoded as two's-complement bytes under their own tag: linear in their size,
# where decimal conversion is quadratic (the reason for CPython's limit).
_DECIMAL_BOUND = 10**4300

_pack = shared_pack(use_bin_type=True)


class Unencodable(Exception):
    """A value has no canonical encoding. ``path`` locates it inside the top-level value.

    ``problem`` says why, or is None when the value's type has no encoding at all.
    """

    def __init__(self, value: object, problem: str | None = None) -> None:
        super().__init__(problem or type(value).__name__)
        self.value = value
        self.problem = problem
        self.path = ""

    def inside(self, segment: str) -> Unencodable:
        self.path = segment + self.path
        return self


def canonical_bytes(value: object) -> bytes:
    """Encode ``value`` canonically.

    >>> canonical_bytes((1, "a")) == canonical_bytes([1, "a"])
    True
    >>> canonical_bytes(1) == canonical_bytes(1.0)
    False
    """
    try:
        return _pack(_canonical(value))
    except Unencodable:
        raise
    except _FAULTS as exc:
        # The slow path, taken only by a value that cannot be encoded: find the part at fault.
        raise _fault_in(value, exc, depth=0) from None


# What encoding a value made of supported types can still raise: UnicodeEncodeError (a lone
# surrogate; a ValueError), RecursionError (a value that contains itself, or nests deeper than
# the interpreter's stack), TypeError (a hashable mapping used as a dict key has no hashable
# canonical form), msgpack's own limits (ValueError).
_FAULTS = (ValueError, OverflowError, TypeError, RecursionError)
# How deep the search for the part at fault goes before it names the part it has reached.
_SEARCH_DEPTH = 64


def _fault_in(value: object, exc: BaseException, depth: int) -> Unencodable:
    """The innermost part of ``value`` that fails to encode on its own, with its path."""
    # Too deep is a property of the whole: name the argument (depth 1), not a level inside it.
    too_deep = isinstance(exc, RecursionError) or "recursion limit" in str(exc)
    if depth < (1 if too_deep else _SEARCH_DEPTH):
        for segment, part in _parts(value):
            try:
                _pack(_canonical(part))
            except Unencodable as inner:
                return inner.inside(segment)
            except _FAULTS as inner:
                return _fault_in(part, inner, depth + 1).inside(segment)
    if too_deep:
        return Unencodable(value, "it nests too deeply or contains itself")
    if isinstance(exc, UnicodeEncodeError):
        bad = exc.object[exc.start : exc.end]
        return Unencodable(
            value,
            f"the text holds {bad!r} at index {exc.start}, a lone surrogate that UTF-8 cannot "
            f"encode (text decoded with errors='surrogateescape' or 'surrogatepass' keeps them)",
        )
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    return Unencodable(value, f"a {kind} value cannot be encoded: {exc}")


def _parts(value: object) -> list[tuple[str, object]]:
    """The parts ``_canonical`` encodes ``value`` from, each with its path segment."""
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return []
    if isinstance(value, Mapping):
        parts = []
        for key, item in value.items():
            parts.append((f"[{key!r}]", item))
            parts.append((f" key {key!r}", key))
        return parts
    if isinstance(value, (list, tuple)):
        return [(f"[{index}]", item) for index, item in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return [(f" member {member!r}", member) for member in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            fields = dump(mode="json")
        except Exception:
            return []
        if isinstance(fields, Mapping):
            return [(f".{name}", item) for name, item in fields.items()]
    return []


def _canonical(value: Any) -> object:
    # Exact type checks first: they cover nearly every real argument at a fraction of the
    # cost of isinstance chains. Subclasses (IntEnum, str enums, OrderedDict, namedtuples)
    # fall through to the isinstance checks below and encode like their base type, as the
    # JSON serializer would send them. (Hence ``value: Any``: an exact type check does not
    # narrow it, and a cast would cost a call on every argument.)
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


def _sequence(items: Iterable[object]) -> tuple[object, ...]:
    # Tuples, not lists: a canonical sequence may become a dict key (pickle users pass
    # tuple keys) and must stay hashable; msgpack packs both as arrays.
    out = []
    for index, item in enumerate(items):
        try:
            out.append(_canonical(item))
        except Unencodable as exc:
            raise exc.inside(f"[{index}]") from None
    return tuple(out)


def _map(mapping: Mapping[object, object]) -> dict[object, object]:
    pairs: list[tuple[Any, object]] = []  # (sorted by _first when every key is a str)
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


def _first(pair: tuple[str, object]) -> str:
    return pair[0]


def _packed_first(pair: tuple[object, object]) -> bytes:
    return _pack(pair[0])


def _big_int(value: int) -> msgpack.ExtType:
    if -_DECIMAL_BOUND < value < _DECIMAL_BOUND:
        try:
            text = str(value)
        except ValueError:
            # This process lowered sys.set_int_max_str_digits: same digits, by another way.
            text = str(Decimal(value))
        return msgpack.ExtType(_BIG_INT, text.encode())
    size = (value.bit_length() + 8) // 8  # room for the sign bit
    return msgpack.ExtType(_HUGE_INT, value.to_bytes(size, "big", signed=True))


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
_AS_BASE: tuple[tuple[type | tuple[type, ...], Callable[[Any], object]], ...] = (
    (bool, bool),
    (int, lambda value: _canonical(int(value))),
    (float, float),
    (str, str),
    ((bytes, bytearray, memoryview), bytes),
    (Mapping, lambda value: _map(value)),
    ((list, tuple), lambda value: _sequence(value)),
)


def _other(value: object) -> object:
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
        try:
            fields = dump(mode="json")
        except Exception as exc:
            raise Unencodable(value, f"its model_dump(mode='json') raised {exc!r}") from exc
        return msgpack.ExtType(_MODEL, _pack((name, _canonical(fields))))
    raise Unencodable(value)
