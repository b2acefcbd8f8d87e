"""The soak session (benchmarks/soak.py, ``./noxw -s soak``): under steady load nothing grows
after warm-up, and a series that does grow fails it. Its short form runs here (about 30 s);
the session runs it for an hour."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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


@pytest.mark.slow
@pytest.mark.soak
def test_producers_and_a_prefork_worker_under_steady_load_stay_flat(
    redis_factory: Any, tmp_path: Path
) -> None:
    server = redis_factory()
    argv = ["--minutes", "0.5", "--every", "2", "--warmup", "0.15"]
    code = soak.main([*argv, "--redis", server.url, "--out", str(tmp_path)])
    report = (tmp_path / "soak.md").read_text()
    assert code == 0, report
    for series in ("producer-1 rss", "worker-child-1 rss", "redis used_memory", "runs/s"):
        assert f"| {series} |" in report
