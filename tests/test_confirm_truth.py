"""A confirm (the provisional record made durable once its message is published) is written
without waiting for its reply. A connection cut right after the write loses it: it lands
anyway, sent again on a new connection, though the thread or process that made the call
makes no other call, or ends. Real servers; a proxy cuts the connection."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery

import dedupe
from dedupe.producer.guard import keys_of_call
from dedupe.store.store import script_text

from .conftest import RedisFactory
from .helpers import wait_for
from .proxies import CuttingProxy

CONFIRM = hashlib.sha1(script_text("confirm").encode()).hexdigest().encode()


@pytest.fixture
def proxy(redis_factory: RedisFactory) -> Iterator[CuttingProxy]:
    cutting = CuttingProxy(redis_factory().port)
    yield cutting
    cutting.close()


@pytest.fixture
def app(make_app: Callable[..., Celery], broker: str, proxy: CuttingProxy) -> Celery:
    # The dedup Redis is not the broker's server: each call is reserved, published, confirmed.
    return make_app(broker=broker, dedupe_redis_url=proxy.url)


def _job(app: Celery) -> Any:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="confirm.job")
    def job(value: str) -> None: ...

    return job


def _confirm_of(job: Any, value: str) -> tuple[bytes, ...]:
    """What the write of the confirm of ``job(value)`` holds: the script's sha and the key."""
    holder = dedupe.lookup(job, (value,))
    assert holder is None
    _, keys = keys_of_call(job, (value,), None, None, {})
    return CONFIRM, keys.call.encode()


def _confirmed(job: Any, value: str) -> bool:
    holder = dedupe.lookup(job, (value,))
    return holder is not None and not holder.provisional


def test_a_cut_confirm_lands_though_its_thread_makes_no_other_call(
    app: Celery, proxy: CuttingProxy, tag: str
) -> None:
    job = _job(app)
    job.delay(f"{tag}-before")  # (the confirm script is known: the next is not waited for)
    proxy.cut_at = _confirm_of(job, tag)
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(job.delay(tag)))
    thread.start()
    thread.join()
    assert results[0].deduplicated is False
    wait_for(lambda: proxy.cuts == 1, message="the confirm cut off")  # (the proxy reads late)
    wait_for(lambda: _confirmed(job, tag), timeout=3, message="the confirm landed")


def test_a_cut_confirm_lands_though_its_process_ends_right_after_the_call(
    app: Celery, proxy: CuttingProxy, tag: str
) -> None:
    job = _job(app)
    proxy.cut_at = _confirm_of(job, tag)
    script = textwrap.dedent(
        f"""
        from celery import Celery
        import dedupe
        app = Celery("child", broker={app.conf.broker_url!r}, set_as_current=False)
        app.conf.update(
            task_default_queue={app.conf.task_default_queue!r},
            dedupe_redis_url={proxy.url!r},
            dedupe_key_prefix={app.conf.dedupe_key_prefix!r},
            broker_transport_options={app.conf.broker_transport_options!r},
        )
        dedupe.install(app)

        @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="confirm.job")
        def job(value): ...

        job.delay({tag + "-before"!r})
        assert job.delay({tag!r}).deduplicated is False
        """
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=60)
    wait_for(lambda: proxy.cuts == 1, message="the confirm cut off")
    wait_for(lambda: _confirmed(job, tag), timeout=3, message="the confirm landed")
