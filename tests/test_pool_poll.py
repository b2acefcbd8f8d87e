"""A prefork pool's process sleeps in the read for a reply of the dedup Redis instead of
spinning on the socket first, unless ``dedupe_busy_poll_us`` is set: the pool's processes
keep every core busy, and a spin takes a sibling's CPU (measured: docs/cost.md)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from celery import Celery, signals

from dedupe.runs.runtime import runtime_of
from dedupe.values.keys import CallKeys
from dedupe.worker.early_claim import pool_accepts_in_place

from .conftest import in_process_worker
from .helpers import exit_code_of_child

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (3.12+: fork, threads)

#: A key no call uses: releasing it is one script call.
_PROBE = CallKeys.of("pool-poll-probe", separate_run_lock=False)


def _polls(app: Celery) -> bool:
    """Does a call of ``app``'s store (made now) poll for its reply?"""
    store = runtime_of(app).store
    store.release(_PROBE, "probe", "probe")
    return bool(store._run._local.poll)


def _in_a_pool_process(app: Celery, *, made_before_the_fork: bool = True) -> bool:
    """Does a call of ``app``'s store, in a child forked as a pool's process is and told
    so as Celery tells it, poll for its reply?"""
    if made_before_the_fork:  # (the pool's parent uses the store before it forks)
        _polls(app)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: told it is a pool's process, one call, then out
        try:
            pool_accepts_in_place("prefork")  # (what the worker's parent noted, inherited)
            signals.worker_process_init.send(sender=None)
            os.write(write, b"1" if _polls(app) else b"0")
            os._exit(0)
        except BaseException:
            os._exit(2)
    os.close(write)
    code = exit_code_of_child(pid)
    assert code is not None, "the child hung"
    assert code == 0, "the child failed"
    answer = os.read(read, 1)
    os.close(read)
    return answer == b"1"


@pytest.mark.parametrize("made_before_the_fork", [True, False], ids=["inherited", "its own"])
def test_a_prefork_pool_process_does_not_poll_for_replies_by_default(
    make_app: Callable[..., Celery], made_before_the_fork: bool
) -> None:
    assert _in_a_pool_process(make_app(), made_before_the_fork=made_before_the_fork) is False


def test_a_prefork_pool_process_polls_for_replies_when_the_setting_says_so(
    make_app: Callable[..., Celery],
) -> None:
    assert _in_a_pool_process(make_app(dedupe_busy_poll_us=50)) is True


def test_a_process_of_no_pool_polls_for_replies_by_default(
    make_app: Callable[..., Celery],
) -> None:
    assert _polls(make_app()) is True


def test_a_solo_workers_process_polls_for_replies_by_default(
    make_app: Callable[..., Celery],
) -> None:
    # (Celery's solo pool sends worker_process_init too, in the worker's own process.)
    app = make_app()
    with in_process_worker(app, pool="solo"):
        pass
    assert _polls(app) is True
