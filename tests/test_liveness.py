"""Is the run in a record dead? A run of this host whose process is gone, or ended and not
reaped yet by its parent (a zombie), is; a live process's is not, nor one of another host."""

from __future__ import annotations

import contextlib
import os
import time

from dedupe.runs.liveness import run_is_dead
from dedupe.values.record import HOST, Holder


def _holder_of(worker: str) -> Holder:
    return Holder(key="k", task_id="t", state="running", ttl=None, worker=worker)


def test_a_run_of_a_live_process_of_this_host_is_alive() -> None:
    assert not run_is_dead(_holder_of(f"{HOST}:{os.getpid()}"))


def test_a_run_whose_process_ended_unreaped_is_dead() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while not run_is_dead(_holder_of(f"{HOST}:{pid}")) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert run_is_dead(_holder_of(f"{HOST}:{pid}"))  # (a zombie: not reaped yet)
        assert os.waitpid(pid, os.WNOHANG) == (pid, 0)  # (it was one, until now)
    finally:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def test_a_run_of_another_host_is_never_known_dead() -> None:
    assert not run_is_dead(_holder_of(f"elsewhere-{HOST}:{os.getpid()}"))
