"""dedupe.prometheus on a real worker: a prefork pool without ``PROMETHEUS_MULTIPROC_DIR``
says at start that its children's run events are never exported; nothing is said with the
variable set, or with a pool that runs tasks in the worker's own process."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from .helpers import WorkerProcess

pytestmark = pytest.mark.slow

WARNING = "PROMETHEUS_MULTIPROC_DIR is not set"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_log(worker_app: Any, tag: str, pool: str, multiproc_dir: Path | None) -> str:
    """The log of a worker of tests.worker_app with dedupe.prometheus enabled (it serves its
    metrics: tests.worker_app enables them then), once it answers a ping."""
    env = {"DEDUPE_TEST_QUEUE": f"metrics-{tag}", "DEDUPE_TEST_METRICS_PORT": str(_free_port())}
    if multiproc_dir is not None:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(multiproc_dir)
    # (-P given again: the last one counts.)
    worker = WorkerProcess(worker_app.app, env=env, extra=("-P", pool))
    if multiproc_dir is None:
        worker.env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # (not even the tests' own)
    worker.start()
    try:
        return worker.tail()
    finally:
        worker.stop()


def test_a_prefork_worker_without_the_multiprocess_directory_says_so_at_start(
    worker_app: Any, tag: str
) -> None:
    log = _start_log(worker_app, tag, "prefork", None)
    (line,) = [line for line in log.splitlines() if WARNING in line]
    assert "WARNING" in line
    assert "dedupe.prometheus" in line
    assert "Set PROMETHEUS_MULTIPROC_DIR to an empty directory" in line  # what to do
    assert "-P threads or -P solo" in line


def test_a_prefork_worker_with_the_multiprocess_directory_says_nothing(
    worker_app: Any, tag: str, tmp_path: Path
) -> None:
    assert WARNING not in _start_log(worker_app, tag, "prefork", tmp_path)


@pytest.mark.parametrize(("pool", "banner"), [("solo", "(solo)"), ("threads", "(thread)")])
def test_a_worker_that_runs_tasks_in_its_own_process_says_nothing(
    worker_app: Any, tag: str, pool: str, banner: str
) -> None:
    log = _start_log(worker_app, tag, pool, None)
    assert banner in log  # (its start banner: the pool it runs)
    assert WARNING not in log
