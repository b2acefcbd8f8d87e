"""``celery dedupe list`` and ``show`` show the calls waiting for their turn: a
key_concurrency line's (handed a slot, or waiting, with its position) and a key_rate_limit
key's planned starts (with when each is due). Real Redis (the broker too: the calls over
the limit wait in Redis); no worker."""

from __future__ import annotations

import re
from typing import Any

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

import dedupe
from dedupe.cli import dedupe as dedupe_cli
from dedupe.runs.runtime import runtime_of
from dedupe.values.limits import lines_index

from .conftest import unique_name


@pytest.fixture
def cli(redis_app: Celery) -> Any:
    def run(*args: str) -> Any:
        context = CLIContext(app=redis_app, no_color=True, workdir=None, quiet=False)
        return CliRunner().invoke(dedupe_cli, list(args), obj=context)

    return run


@pytest.fixture
def limited(redis_app: Celery) -> Any:
    @redis_app.task(shared=False, base=dedupe.DedupeTask, name="jobs.limited", key_concurrency=1)
    def limited(tenant: int) -> None: ...

    return limited


@pytest.fixture
def paced(redis_app: Celery) -> Any:
    @redis_app.task(shared=False, base=dedupe.DedupeTask, name="jobs.paced", key_rate_limit="1/m")
    def paced(tenant: int) -> None: ...

    return paced


def test_list_shows_the_waiting_calls_of_a_line_with_their_position(cli: Any, limited: Any) -> None:
    calls = [limited.delay(7) for _ in range(3)]
    result = cli("list")
    assert result.exit_code == 0, result.output
    assert re.search(rf"handed .*{calls[0].id} .*#1", result.output)
    assert re.search(rf"waiting .*{calls[1].id} .*#2", result.output)
    assert re.search(rf"waiting .*{calls[2].id} .*#3", result.output)


def test_list_shows_when_each_planned_start_is_due(cli: Any, paced: Any) -> None:
    calls = [paced.delay(7) for _ in range(3)]
    output = cli("list", "--task", "jobs.paced").output
    due = {
        call.id: int(match.group(1))
        for call in calls
        if (match := re.search(rf"in (\d+)s\s+{call.id}", output))
    }
    assert len(due) == 3, output
    assert due[calls[0].id] <= 1
    assert 58 <= due[calls[1].id] <= 60
    assert 118 <= due[calls[2].id] <= 120


def test_show_lists_the_line_of_a_calls_key(cli: Any, limited: Any) -> None:
    calls = [limited.delay(7) for _ in range(2)]
    limited.delay(8)  # (another key's line)
    result = cli("show", "jobs.limited", "--args", "[7]")
    assert result.exit_code == 0, result.output
    assert [call.id in result.output for call in calls] == [True, True]
    assert result.output.count("#") == 2


def test_list_reads_only_its_own_prefix_when_the_prefix_holds_a_glob_character(
    make_app: Any,
) -> None:
    # "t?" as a SCAN pattern would match "ta"'s keys too.
    base = unique_name("g")
    other = make_app(dedupe_key_prefix=f"{base}a")
    app = make_app(dedupe_key_prefix=f"{base}?")
    for each in (other, app):

        @each.task(shared=False, base=dedupe.DedupeTask, name="jobs.limited", key_concurrency=1)
        def limited(tenant: int) -> None: ...

    others = [other.tasks["jobs.limited"].delay(7) for _ in range(2)]
    context = CLIContext(app=app, no_color=True, workdir=None, quiet=False)
    result = CliRunner().invoke(dedupe_cli, ["list"], obj=context)
    assert result.exit_code == 0, result.output
    assert [call.id in result.output for call in others] == [False, False]


def test_the_index_of_the_lines_lives_no_longer_than_the_lines_it_names(
    limited: Any, redis_app: Celery, redis_client: Any
) -> None:
    # (A prefix no worker looks at any more leaves no key behind.)
    for _ in range(2):
        limited.delay(7)
    index = lines_index(redis_app.conf.dedupe_key_prefix)
    assert redis_client.zcard(index) == 1
    assert 0 < redis_client.pttl(index) <= runtime_of(redis_app).config.default_ttl * 1000 + 1000
