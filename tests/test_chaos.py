"""The chaos run's short form (tests/chaos/run.py --quick): producers, two prefork workers,
kills of children and whole workers, a dedup-Redis restart and a broker cut; then the
invariants of issue 14. ``./noxw -s chaos`` runs the full scenario on both brokers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .helpers import ROOT, rabbitmq_available, require

pytestmark = pytest.mark.slow


def _chaos(tmp_path: Path, *args: str, timeout: float = 240) -> tuple[dict[str, Any], str]:
    """Run the harness in a process of its own; its rows per broker and its output."""
    report = tmp_path / "chaos.json"
    done = subprocess.run(
        [sys.executable, "-m", "tests.chaos", "--quick", "--json", str(report), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = done.stdout + done.stderr[-5000:]
    assert report.exists(), output
    return json.loads(report.read_text()), output


def _failures(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {row["check"]: row["details"][:5] for row in rows if row["verdict"] == "FAIL"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("broker", ["redis", "amqp"])
def test_chaos_short_form_keeps_the_invariants(tmp_path: Path, broker: str) -> None:
    if broker == "amqp":
        require(rabbitmq_available(), "RabbitMQ is not reachable at 127.0.0.1:5672")
    report, output = _chaos(tmp_path, "--broker", broker)
    rows = report[broker]["rows"]
    print(output)
    assert _failures(rows) == {}, output
    counts = {row["check"]: row["count"] for row in rows}
    # 4 kills, the restart, the cut, 2 drops of every dedup client, 6 soft time limits, a
    # purge of the side queue
    assert counts["faults injected"] == 15
    # The side producer's calls were made: some purged (their keys reaped: no key is left
    # after the drain), some of a task no worker knows (dropped, their keys freed at once).
    assert counts["side: calls made (purgeable, unknown task)"] == 30
    assert counts["side: accepted calls purged (their keys to the reaper)"] > 0
    assert counts["side: accepted calls of a task no worker knows"] > 0
    # The debounced task was called, in bursts (fewer accepted calls than calls).
    assert counts["debounced: calls / bursts / runs"] > 50
    # The limited tasks were called beyond their limits (deliveries sent again to wait).
    assert counts["limited / rated / paced: calls"] > 50


@pytest.mark.timeout(120)
def test_chaos_fails_on_plain_celery_tasks(tmp_path: Path) -> None:
    """The checks can fail: the same calls on tasks without dedupe queue duplicates and
    overlap runs, with no fault injected."""
    report, output = _chaos(
        tmp_path,
        "--broker",
        "redis",
        "--plain",
        "--kills",
        "0",
        "--no-restart-dedup",
        "--no-cut-broker",
        "--client-kills",
        "0",
        "--duration",
        "8",
        "--calls",
        "60",
        "--drain",
        "30",
    )
    failures = _failures(report["redis"]["rows"])
    assert "duplicate queued outside a dedup-Redis restart window" in failures, output
    assert "overlapping runs of one key" in failures, output
