"""The ``argsrepr`` and ``kwargsrepr`` of a message, made cheaply where Celery's would be
the same.

Celery's ``as_task_v2`` writes ``saferepr(args)`` and ``saferepr(kwargs)`` into every
message (for Flower and the logs): a few microseconds a call, most of what builds a small
message's headers. For flat arguments of plain scalars, ``saferepr`` prints what ``repr``
prints, and ``repr`` costs a fraction of it. Anything else (strings that need quoting or
escaping, nested containers, floats, long output) is left to Celery: None.

>>> plain_repr((1, "a", None), maxsize=1024, maxlevels=3)
"(1, 'a', None)"
>>> plain_repr(("it's",), maxsize=1024, maxlevels=3) is None
True
"""

from __future__ import annotations

from typing import Any

__all__ = ["plain_repr"]

# Printable ASCII that repr and saferepr quote alike: no quotes, no backslash.
_PLAIN_CHARS = frozenset(map(chr, range(32, 127))) - {"'", '"', "\\"}
_LONGEST_STR = 64


def _plain_scalar(value: Any) -> bool:
    kind = type(value)
    if kind is int or kind is bool or value is None:
        return True
    return kind is str and len(value) <= _LONGEST_STR and _PLAIN_CHARS.issuperset(value)


def plain_repr(value: Any, *, maxsize: int, maxlevels: int | None) -> str | None:
    """``saferepr(value, maxsize, maxlevels=maxlevels)`` for a flat tuple or list of plain
    scalars, or a dict of them under plain string keys; None for anything else."""
    if maxlevels is not None and maxlevels < 1:
        return None
    kind = type(value)
    if kind is tuple or kind is list:
        for item in value:
            if not _plain_scalar(item):
                return None
    elif kind is dict:
        for key, item in value.items():
            if type(key) is not str or not _plain_scalar(key) or not _plain_scalar(item):
                return None
    else:
        return None
    text = repr(value)
    # (saferepr shortens what outgrows maxsize: leave anything near it to saferepr.)
    return text if len(text) <= maxsize // 2 else None
