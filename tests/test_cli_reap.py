"""``celery dedupe purge`` frees the keys of what it purged; ``celery dedupe reap`` frees
queued keys whose message is gone; ``list`` marks what the reaper found without a message
(issue 40)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

import dedupe
from dedupe.cli import dedupe as dedupe_cli
from dedupe.runs.reaping import Reaper
from dedupe.runs.runtime import runtime_of

from .conftest import unique_name

pytestmark = pytest.mark.slow


@pytest.fixture
def reaping_app(make_app: Callable[..., Celery], broker: str, redis_factory: Any) -> Celery:
    # (A Redis broker of its own: a pass reads every message of its broker.)
    own = broker if broker.startswith("amqp") else redis_factory().url
    return make_app(broker=own, dedupe_reap_interval=1, dedupe_reap_margin=1)


def cli(app: Celery, *args: str, input: str | None = None) -> Any:
    context = CLIContext(app=app, no_color=True, workdir=None, quiet=False)
    return CliRunner().invoke(dedupe_cli, list(args), obj=context, input=input)


def unique_task(app: Celery) -> Any:
    @app.task(name=unique_name("cli"), shared=False, base=dedupe.DedupeTask, unique=True)
    def echo(x: int) -> int:
        return x

    return echo


def test_purge_frees_the_keys_of_the_messages_it_purged(reaping_app: Celery) -> None:
    task = unique_task(reaping_app)
    task.delay(1), task.delay(2)
    result = cli(reaping_app, "purge", "--yes")
    assert result.exit_code == 0, result.output
    assert f"{reaping_app.conf.task_default_queue}: 2 messages purged" in result.output
    assert "2 keys freed" in result.output
    assert dedupe.lookup(task, (1,)) is None
    assert dedupe.lookup(task, (2,)) is None
    assert task.delay(1).deduplicated is False


def test_purge_asks_first_and_leaves_everything_when_told_no(reaping_app: Celery) -> None:
    task = unique_task(reaping_app)
    first = task.delay(1)
    result = cli(reaping_app, "purge", input="n\n")
    assert result.exit_code == 1
    assert "Aborted" in result.output
    assert dedupe.lookup(task, (1,)).task_id == first.id  # type: ignore[union-attr]


def test_purge_leaves_a_key_a_later_call_holds(reaping_app: Celery, side_queue: str) -> None:
    # The key was cleared by hand after the first call, and a second call of it went to
    # another queue: purging the first's message must not free the second's key.
    task = unique_task(reaping_app)
    task.delay(1)
    dedupe.clear(task, (1,))
    later = task.apply_async((1,), queue=side_queue)
    result = cli(reaping_app, "purge", "-Q", reaping_app.conf.task_default_queue, "--yes")
    assert f"{reaping_app.conf.task_default_queue}: 1 messages purged" in result.output
    assert "0 keys freed" in result.output
    assert dedupe.lookup(task, (1,)).task_id == later.id  # type: ignore[union-attr]


def test_reap_frees_a_key_whose_message_was_purged_by_celery(reaping_app: Celery) -> None:
    task = unique_task(reaping_app)
    first = task.delay(7)
    holder = dedupe.lookup(task, (7,))
    assert holder is not None
    reaping_app.control.purge()
    time.sleep(1.2)  # (past the margin)
    result = cli(reaping_app, "reap", "--wait", "1.2")
    assert result.exit_code == 0, result.output
    assert "1 without a message, 1 freed" in result.output
    assert f"freed {holder.key}" in result.output
    assert dedupe.lookup(task, (7,)) is None
    assert task.delay(7).id != first.id


def test_list_marks_only_the_keys_the_reaper_found_without_a_message(
    make_app: Callable[..., Celery],
) -> None:
    # On a Redis broker: on RabbitMQ, the message waiting in the same queue would keep
    # the purged one's key unmarked too (a queue that is not empty tells nothing).
    reaping_app = make_app(dedupe_reap_interval=1, dedupe_reap_margin=1)
    task = unique_task(reaping_app)
    purged = task.delay(7)
    reaping_app.control.purge()
    waiting = task.delay(8)
    time.sleep(1.2)  # (past the margin)
    Reaper(runtime_of(reaping_app)).sweep()
    lines = cli(reaping_app, "list").output.splitlines()
    assert [line for line in lines if "(no message)" in line] == [
        line for line in lines if purged.id in line
    ]
    assert any(waiting.id in line for line in lines)
