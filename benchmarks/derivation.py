"""Key derivation: microseconds to bind, encode and digest a call's arguments."""

from __future__ import annotations

import inspect
import statistics
import time
from collections.abc import Callable
from typing import Any

from dedupe.values.key_derivation import Binder, call_digest


def one(value: Any) -> None: ...


def ten(
    a: Any,
    b: Any,
    c: Any,
    d: Any,
    e: Any,
    f: Any = 0,
    g: Any = "",
    h: Any = None,
    i: Any = False,
    j: Any = 1.5,
) -> None: ...


def _micros(fn: Callable[[], Any], repeat: int) -> float:
    samples = []
    for _ in range(7):
        start = time.perf_counter_ns()
        for _ in range(repeat):
            fn()
        samples.append((time.perf_counter_ns() - start) / repeat / 1000)
    return statistics.median(samples)


def run() -> dict[str, float]:
    """Median microseconds per derivation."""
    single = Binder("bench.one", inspect.signature(one))
    results = {}
    for size in (1, 10, 100, 10_000):
        value = list(range(size))
        repeat = max(20, 200_000 // (size + 20))

        def derive(value: list[int] = value) -> str:
            return call_digest("bench.one", single, (value,), {})

        results[f"a list of {size:,} ints"] = _micros(derive, repeat)
    several = Binder("bench.ten", inspect.signature(ten))
    args = (42, "customer", 3.5, True, None)
    kwargs = {"f": 7, "g": "eu-west", "h": "2026-11-22", "i": True, "j": 0.25}
    results["10 small arguments"] = _micros(
        lambda: call_digest("bench.ten", several, args, kwargs), 20_000
    )
    return results
