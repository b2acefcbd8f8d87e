"""The soak session's verdict (benchmarks/soak.py, ``./noxw -s soak``): a series whose fitted
line rises past its bound after warm-up, or a rate that falls, is not flat. The soak itself
is not run here: 30 s of it took 41 s with its start-up, and an hour is what it is for."""

from __future__ import annotations

from benchmarks import soak


def _leaking(per_second: float) -> list[dict[str, float]]:
    """A minute of samples every 2 s: one flat series, one rising ``per_second``, a steady rate."""
    return [
        {"t": t, "worker rss": 60.0 + (t % 4) * 0.1, "producer-0 rss": 50.0 + per_second * t}
        | {"calls/s": 80.0}
        for t in range(0, 60, 2)
    ]


def test_a_series_that_grows_past_its_bound_after_warm_up_is_not_flat() -> None:
    found = {v.series: v.ok for v in soak.verdicts(_leaking(0.1), warmup=10)}
    assert found == {"worker rss": True, "producer-0 rss": False, "calls/s": True}


def test_growth_within_the_bound_is_flat() -> None:
    found = {v.series: v.ok for v in soak.verdicts(_leaking(0.01), warmup=10)}
    assert found == {"worker rss": True, "producer-0 rss": True, "calls/s": True}


def test_a_falling_rate_is_not_flat() -> None:
    samples = [{"t": float(t), "runs/s": 40.0 - t / 2} for t in range(0, 60, 2)]
    assert [v.ok for v in soak.verdicts(samples, warmup=10)] == [False]
