"""``celery -A proj dedupe ...``: list, show, clear, check."""

from __future__ import annotations

import os
import re
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
from dedupe.store import checks
from dedupe.values.urls import redacted

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


# --- Failing loudly (issue 30): one line and a status, never a traceback or a false "fine" ---


def _celery(
    *args: str, env: dict[str, str] | None = None, module: str = "tests.worker_app", cwd: Any = ROOT
) -> subprocess.CompletedProcess[str]:
    """The real ``celery -A module dedupe ...`` command, in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", module, "dedupe", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def down_url(redis_factory: Any) -> str:
    """The URL of a dedup Redis that is down (a port where nothing listens), with a password."""
    port = redis_factory(start=False).port
    return f"redis://:hunter2@127.0.0.1:{port}/0"


@pytest.fixture
def down_cli(make_app: Any, down_url: str) -> Any:
    app = make_app(dedupe_redis_url=down_url)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="reports.refresh")
    def refresh(report_id: int) -> None: ...

    def run(*args: str) -> Any:
        context = CLIContext(app=app, no_color=True, workdir=None, quiet=False)
        return CliRunner().invoke(dedupe_cli, list(args), obj=context, input="y\n")

    return run


@pytest.mark.parametrize(
    "args",
    [
        ["list"],
        ["stats"],
        ["show", "reports.refresh", "--args", "[1]"],
        ["clear", "reports.refresh", "--args", "[1]"],
        ["clear", "--all", "--yes"],
        ["check"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_every_subcommand_says_in_one_line_that_redis_is_down(
    down_cli: Any, down_url: str, args: list[str]
) -> None:
    result = down_cli(*args)
    assert result.exit_code == 1, result.output
    assert not isinstance(result.exception, redis.RedisError), result.exception
    shown = redacted(down_url)
    said = [line for line in result.output.splitlines() if shown in line]
    assert len(said) == 1, result.output
    assert "cannot reach the dedup Redis" in said[0]
    assert "hunter2" not in result.output


def test_the_celery_command_says_in_one_line_that_redis_is_down(down_url: str) -> None:
    completed = _celery("list", env={"DEDUPE_TEST_STORE": down_url})
    assert completed.returncode == 1, completed.stderr
    assert "Traceback" not in completed.stderr
    assert completed.stderr.strip().splitlines() == [
        f"Error: cannot reach the dedup Redis at {redacted(down_url)} (ConnectionError: "
        f"Error 111 connecting to 127.0.0.1:{down_url.rsplit(':', 1)[1].split('/')[0]}. "
        f"Connection refused.): start it, or point dedupe_redis_url at a running one"
    ]


_BARE_APP = """
import os
from celery import Celery

app = Celery("bare", broker=os.environ["DEDUPE_TEST_BROKER"])
app.conf.dedupe_key_prefix = os.environ["BARE_PREFIX"]
# No dedupe.install(app): the mistake under test.
"""


@pytest.fixture
def bare_module(tmp_path: Any, redis_url: str) -> dict[str, Any]:
    """A module whose Celery app never called dedupe.install, for ``celery -A bare``."""
    (tmp_path / "bare.py").write_text(_BARE_APP)
    return {
        "module": "bare",
        "cwd": tmp_path,
        "env": {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "BARE_PREFIX": "bare"},
    }


def test_check_fails_on_an_app_that_never_called_install(bare_module: dict[str, Any]) -> None:
    completed = _celery("check", **bare_module)
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert (
        "FAIL  installed: celery-dedupe is not installed on Celery app 'bare': call "
        "dedupe.install(app) once where the app is created" in completed.stdout
    )


def test_list_on_an_app_that_never_called_install_says_so_on_stderr(
    bare_module: dict[str, Any],
) -> None:
    completed = _celery("list", **bare_module)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "no live keys\n"
    assert completed.stderr.splitlines() == [
        "warning: celery-dedupe is not installed on Celery app 'bare': call dedupe.install(app) "
        "once where the app is created (producers and workers alike). Reading its keys anyway."
    ]


def test_an_unknown_task_name_is_a_usage_error_naming_the_nearest(redis_url: str) -> None:
    completed = _celery("list", "--task", "tests.worker_app.sleepyy")
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert (
        "no task 'tests.worker_app.sleepyy' in app 'worker_app', and no live key of that "
        "name; did you mean: tests.worker_app.sleepy" in completed.stderr
    )


@pytest.mark.parametrize(
    "args",
    [
        ["stats", "--task", "reports.refresh_"],
        ["show", "reports.refresh_", "--args", "[1]"],
        ["clear", "reports.refresh_", "--args", "[1]"],
        ["clear", "--task", "reports.refresh_", "--yes"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_every_subcommand_refuses_an_unknown_task_name(cli: Any, job: Any, args: list[str]) -> None:
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert "no task 'reports.refresh_'" in result.output
    assert "did you mean: reports.refresh" in result.output


def test_list_starts_with_a_header_row(redis_app: Celery) -> None:
    held = dedupe.apply_async("reports.refresh", args=(1,), app=redis_app)
    completed = _celery("list", env={"DEDUPE_TEST_PREFIX": redis_app.conf.dedupe_key_prefix})
    lines = completed.stdout.splitlines()
    assert lines[0].split() == ["state", "ttl", "since", "task", "id", "key"]
    assert held.id in lines[1]


def _check_lines(output: str) -> dict[str, str]:
    """``check``'s lines by the name of their check: the status and what it says."""
    lines: dict[str, str] = {}
    for line in output.splitlines():
        status, _, rest = line.partition("  ")
        name, _, said = rest.strip().partition(": ")
        if status.strip() in ("ok", "warn", "FAIL"):
            lines[name] = f"{status.strip()} {said}"
    return lines


def test_check_prints_one_ok_warn_or_fail_line_per_check(redis_url: str) -> None:
    completed = _celery("check")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    lines = _check_lines(completed.stdout)
    assert set(lines) == {"installed", "redis", "version", "eviction", "acl", "visibility"}
    assert lines["redis"].startswith("ok ")
    assert lines["version"].startswith("ok Redis ")


def test_check_fails_when_redis_may_evict_live_keys(make_app: Any, redis_factory: Any) -> None:
    server = redis_factory("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru")
    app = make_app(dedupe_redis_url=server.url)
    result = CliRunner().invoke(dedupe_cli, ["check"], obj=CLIContext(app, True, None, False))
    assert result.exit_code == 1
    assert _check_lines(result.output)["eviction"].startswith(
        "FAIL the dedup Redis evicts keys under memory pressure"
    )


def _acl_app(make_app: Any, redis_factory: Any, rules: str) -> Celery:
    """An app whose dedup Redis user is ``dedup`` with ``rules``."""
    server = redis_factory()
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", "dedup", "on", ">pw", *rules.split())
    admin.close()
    return make_app(dedupe_redis_url=f"redis://dedup:pw@127.0.0.1:{server.port}/0")


def test_check_fails_when_the_acl_denies_a_command_the_scripts_call(
    make_app: Any, redis_factory: Any
) -> None:
    # This user may run ACL DRYRUN: the check asks the server about each command.
    app = _acl_app(make_app, redis_factory, "~* &* +@all -time")
    result = CliRunner().invoke(dedupe_cli, ["check"], obj=CLIContext(app, True, None, False))
    assert result.exit_code == 1, result.output
    assert _check_lines(result.output)["acl"] == (
        "FAIL user 'dedup' may not run: TIME; allow it: ACL SETUSER dedup +time"
    )


def test_check_fails_when_the_acl_denies_a_command_to_a_user_without_acl_rights(
    make_app: Any, redis_factory: Any
) -> None:
    # No ACL DRYRUN for this user: the check tries each command on a key no one uses.
    app = _acl_app(make_app, redis_factory, "~* &* +@all -@admin -pttl")
    result = CliRunner().invoke(dedupe_cli, ["check"], obj=CLIContext(app, True, None, False))
    assert result.exit_code == 1, result.output
    assert _check_lines(result.output)["acl"].startswith(
        "FAIL user 'dedup' may not run: PTTL; allow it: ACL SETUSER dedup +pttl"
    )


def test_check_passes_the_acl_user_the_docs_give(make_app: Any, redis_factory: Any) -> None:
    rules = (
        "resetchannels ~dedupe:* ~t* ~celery* +evalsha +script|load +get +set +del +exists "
        "+pexpire +pttl +time +lpush +scan +info +ping +blpop +config|get +hello "
        "+client|tracking +client|caching"
    )
    app = _acl_app(make_app, redis_factory, rules)
    result = CliRunner().invoke(dedupe_cli, ["check"], obj=CLIContext(app, True, None, False))
    assert result.exit_code == 0, result.output
    assert _check_lines(result.output)["acl"].startswith("ok ")


@pytest.mark.parametrize(
    ("version", "status"),
    [("7.2.4", "ok"), ("6.2.0", "ok"), ("6.0.16", "warn"), ("5.0.7", "FAIL")],
)
def test_check_judges_the_redis_version_as_the_docs_do(version: str, status: str) -> None:
    assert checks.version_verdict(version)[0] == status


def test_check_warns_when_the_visibility_timeout_outlives_an_acks_late_lease(
    redis_app: Celery,
) -> None:
    @redis_app.task(shared=False, base=dedupe.DedupeTask, unique=True, acks_late=True, name="j")
    def late() -> None: ...

    result = CliRunner().invoke(dedupe_cli, ["check"], obj=CLIContext(redis_app, True, None, False))
    assert result.exit_code == 0, result.output
    line = _check_lines(result.output)["visibility"]
    assert line.startswith("warn acks_late tasks on the Redis broker (")
    # (Named among the app's others: a test module imported before may have added its
    # shared tasks to every app, as Celery adds shared tasks.)
    assert "j" in line.split("(", 1)[1].split(")", 1)[0].split(", ")


def test_check_knows_every_command_the_scripts_call() -> None:
    called = {
        name.upper()
        for path in (ROOT / "dedupe" / "store" / "lua").glob("*.lua")
        for name in re.findall(r"redis\.p?call\(\s*'(\w+)'", path.read_text())
    }
    assert called <= set(checks.NEEDED_COMMANDS)
