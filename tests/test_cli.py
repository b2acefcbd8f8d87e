"""``celery -A proj dedupe ...``: list, show, clear, check."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest
import redis
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

import dedupe
import dedupe.runs.runtime
from dedupe.cli import dedupe as dedupe_cli

from .helpers import ROOT


@pytest.fixture
def cli(app: Celery) -> Any:
    def run(*args: str, input: str | None = None) -> Any:
        context = CLIContext(app=app, no_color=True, workdir=None, quiet=False)
        return CliRunner().invoke(dedupe_cli, list(args), obj=context, input=input)

    return run


@pytest.fixture
def job(app: Celery) -> Any:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="reports.refresh")
    def refresh(report_id: int, full: bool = False) -> None: ...

    return refresh


def test_list_shows_each_live_key_with_its_holder(cli: Any, job: Any) -> None:
    first, second = job.delay(1), job.delay(2)
    result = cli("list")
    assert result.exit_code == 0
    assert first.id in result.output
    assert second.id in result.output
    assert result.output.count("queued") == 2


def test_list_can_be_limited_to_one_task(cli: Any, job: Any, app: Celery) -> None:
    job.delay(1)
    dedupe.apply_async("other.task", args=(1,), app=app)
    result = cli("list", "--task", "other.task")
    assert "other.task" in result.output
    assert "reports.refresh" not in result.output


def test_list_says_when_there_is_nothing(cli: Any) -> None:
    assert "no live keys" in cli("list").output


def test_list_reports_a_value_that_is_no_record_and_goes_on(
    cli: Any, job: Any, app: Celery, redis_client: redis.Redis
) -> None:
    held = job.delay(1)
    stray = f"{app.conf.dedupe_key_prefix}:{{other.program:1}}"
    redis_client.set(stray, b"not ours")
    result = cli("list")
    assert result.exit_code == 0
    assert f"unknown  {stray} holds no celery-dedupe record" in result.output
    assert held.id in result.output


def test_show_finds_the_holder_of_a_call_spelled_any_way(cli: Any, job: Any) -> None:
    held = job.delay(3, full=False)
    result = cli("show", "reports.refresh", "--kwargs", '{"report_id": 3}')
    assert result.exit_code == 0
    assert held.id in result.output


def test_show_says_free_for_a_free_call(cli: Any, job: Any) -> None:
    assert "free" in cli("show", "reports.refresh", "--args", "[4]").output


def test_clear_frees_the_key_of_one_call(cli: Any, job: Any) -> None:
    job.delay(5)
    assert "cleared 1 key" in cli("clear", "reports.refresh", "--args", "[5]").output
    assert job.delay(5).deduplicated is False


def test_clear_every_key_of_a_task_asks_first(cli: Any, job: Any) -> None:
    job.delay(6)
    job.delay(7)
    refused = cli("clear", "--task", "reports.refresh", input="n\n")
    assert refused.exit_code == 1
    assert dedupe.lookup(job, (6,)) is not None
    assert "cleared 2 keys" in cli("clear", "--task", "reports.refresh", "--yes").output
    assert dedupe.lookup(job, (6,)) is None


def test_clear_task_leaves_the_keys_of_a_task_whose_name_extends_it(cli: Any, app: Celery) -> None:
    dedupe.apply_async("reports", args=(1,), app=app)
    kept = dedupe.apply_async("reports:eu", args=(1,), app=app)
    result = cli("clear", "--task", "reports", "--yes")
    assert "cleared 1 key" in result.output
    assert dedupe.lookup("reports:eu", args=(1,), app=app).task_id == kept.id


def test_list_task_takes_glob_characters_literally(cli: Any, app: Celery) -> None:
    own = dedupe.apply_async("jobs[1]", args=(1,), app=app)
    other = dedupe.apply_async("jobs1", args=(1,), app=app)
    result = cli("list", "--task", "jobs[1]")
    assert own.id in result.output
    assert other.id not in result.output


def test_clearing_a_running_key_says_that_the_run_goes_on(cli: Any, job: Any, app: Celery) -> None:
    held = job.delay(5)
    store = dedupe.runs.runtime.runtime_of(app).store
    assert store.claim(held.keys, held.id, "run-1", 30_000, "host", 1, int(time.time())) is None
    result = cli("clear", "--task", "reports.refresh", "--yes")
    assert "cleared 1 key" in result.output
    assert "1 of them held by running tasks: a run goes on after its key is cleared" in (
        result.output
    )


def test_stats_counts_live_keys_by_task_and_state(cli: Any, job: Any, app: Celery) -> None:
    job.delay(1)
    job.delay(2)
    dedupe.apply_async("other.task", args=(1,), app=app)
    lines = cli("stats").output.splitlines()
    assert lines[0].split() == ["task", "queued", "running", "provisional"]
    assert lines[1].split() == ["other.task", "1", "0", "0"]
    assert lines[2].split() == ["reports.refresh", "2", "0", "0"]
    assert lines[3].split() == ["total", "3", "0", "0"]


def test_clear_needs_exactly_one_target(cli: Any) -> None:
    result = cli("clear")
    assert result.exit_code == 2
    assert "exactly one of" in result.output


@pytest.mark.parametrize(
    ("args", "option", "message"),
    [
        (["--args", "[1,"], "--args", "not JSON"),
        (["--args", '{"a": 1}'], "--args", "must be a JSON list, like '[42, \"eu\"]'"),
        (["--kwargs", "[1]"], "--kwargs", "must be a JSON object"),
    ],
)
def test_bad_arguments_are_named_with_the_fix(
    cli: Any, args: list[str], option: str, message: str
) -> None:
    result = cli("show", "reports.refresh", *args)
    assert result.exit_code == 2
    assert f"Invalid value for {option}: {message}" in result.output


def test_arguments_that_do_not_fit_the_task_are_reported(cli: Any, job: Any) -> None:
    result = cli("show", "reports.refresh", "--kwargs", '{"nope": 1}')
    assert result.exit_code == 1
    assert "reports.refresh(report_id, full=False)" in result.output


def test_check_reports_a_reachable_redis(cli: Any) -> None:
    result = cli("check")
    assert result.exit_code == 0
    assert "reachable" in result.output


def test_the_celery_command_knows_the_dedupe_subcommand(redis_url: str) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.worker_app", "dedupe", "check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    assert "reachable" in completed.stdout
