"""The README's demo command works end to end."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dedupe.demo.server import RedisServer

from .helpers import ROOT

pytestmark = pytest.mark.slow  # the demo runs a worker in a subprocess


def test_the_demo_publishes_once_runs_once_and_leaves_no_key(redis_server: RedisServer) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "dedupe.demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "published       1" in completed.stdout
    assert "deduplicated   99" in completed.stdout
    assert "runs            1" in completed.stdout


def test_the_demo_uses_a_given_redis(redis_server: RedisServer) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "dedupe.demo", "--redis", redis_server.url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert f"Redis at {redis_server.url} (given)" in completed.stdout
