"""A user's mistake is answered with a clear error naming the task, option or setting and the
fix, at registration, at install() or at the call, before anything is sent: never with
dedup silently off, never with another library's raw error."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, Task

import dedupe

from .conftest import in_process_worker
from .helpers import ROOT, Lines

# -- declared on the task: refused when Celery registers it -----------------------------------

DECLARATIONS = [
    ({"uniqe": True}, r"uniqe is not an option of celery-dedupe; did you mean unique\?"),
    ({"unique": True, "unique_tll": 5}, r"unique_tll .* did you mean unique_ttl\?"),
    ({"unique": True, "debounce": 1, "unique_until": "finished"}, r"debounce ends a burst"),
    (
        {"unique": True, "key_concurrency": 2},
        r"key_concurrency accepts every call .* drop unique=True",
    ),
    ({"key_rate_limit": "2/sec"}, r"key_rate_limit must be \"<N>/s\""),
    ({"unique": True, "unique_ttl": float("inf")}, r"unique_ttl must be at most .* got inf"),
    ({"unique": True, "unique_ttl": 1e16}, r"unique_ttl must be at most .* got 1e\+16"),
    ({"unique": True, "on_running": "wait"}, r"on_running must be 'skip' or 'retry'"),
]


@pytest.mark.parametrize(
    ("declared", "error"), DECLARATIONS, ids=[repr(d) for d, _ in DECLARATIONS]
)
def test_a_dedupe_task_with_a_wrong_option_is_refused_as_celery_registers_it(
    redis_app: Celery, declared: dict[str, Any], error: str
) -> None:
    decorate = redis_app.task(
        base=dedupe.DedupeTask, shared=False, name="loud.declared", **declared
    )
    redis_app.finalize()  # (a finalized app registers a task as it is decorated)
    with pytest.raises(dedupe.ConfigurationError, match=r"task 'loud\.declared': " + error):
        decorate(_body)


def test_a_dedupe_task_keeps_attributes_of_its_own(redis_app: Celery) -> None:
    task = redis_app.task(
        base=dedupe.DedupeTask, shared=False, name="loud.own", unique=True, report_kind="daily"
    )(_body)
    _ = redis_app.tasks
    assert task.delay(1).deduplicated is False


# -- given to a call, or declared on a plain task: refused at the call, nothing sent -----------

CALLS: list[tuple[str, Callable[[Any, Any], Any], str]] = [
    (
        "plain task declared unique",
        lambda plain_unique, plain: plain_unique.delay(1),
        r"task 'loud\.plain_unique': unique does nothing here; declare the task with "
        r"base=dedupe\.DedupeTask",
    ),
    (
        "plain call with unique",
        lambda plain_unique, plain: plain.apply_async((1,), unique=True),
        r"task 'loud\.plain': unique does nothing here",
    ),
    (
        "plain call with a call option",
        lambda plain_unique, plain: plain.apply_async((1,), unique_ttl=60),
        r"unique_ttl does nothing here; .* or call dedupe\.apply_async\(task, \.\.\., unique_ttl",
    ),
    (
        "a task name sent with unique",
        lambda plain_unique, plain: plain.app.send_task("loud.plain", (1,), unique=True),
        r"task 'loud\.plain': unique does nothing here",
    ),
    (
        "plain call with a misspelt option",
        lambda plain_unique, plain: plain.apply_async((1,), uniqe=True),
        r"uniqe is not an option of celery-dedupe; did you mean unique\? \(an option of a "
        r"task declared with base=dedupe\.DedupeTask\)",
    ),
]


@pytest.mark.parametrize(("case", "call", "error"), CALLS, ids=[case for case, _, _ in CALLS])
def test_a_plain_call_with_a_dedup_option_is_refused_before_it_is_sent(
    app: Celery,
    queue_length: Callable[[Celery], int],
    case: str,
    call: Callable[[Any, Any], Any],
    error: str,
) -> None:
    plain_unique = app.task(shared=False, name="loud.plain_unique", unique=True)(_body)
    plain = app.task(shared=False, name="loud.plain")(_body)
    with pytest.raises(dedupe.ConfigurationError, match=error):
        call(plain_unique, plain)
    assert queue_length(app) == 0


def test_a_misspelt_call_option_of_a_dedupe_task_is_refused_before_anything_is_written(
    app: Celery, queue_length: Callable[[Celery], int], redis_client: Any
) -> None:
    task = app.task(base=dedupe.DedupeTask, shared=False, name="loud.dedupe", unique=True)(_body)
    with pytest.raises(dedupe.ConfigurationError, match=r"uniqe .* did you mean unique\?"):
        task.apply_async((1,), uniqe=True)
    assert queue_length(app) == 0
    assert redis_client.keys(f"{app.conf.dedupe_key_prefix}:*") == []


def test_a_call_option_out_of_range_is_refused(app: Celery) -> None:
    task = app.task(base=dedupe.DedupeTask, shared=False, name="loud.range")(_body)
    with pytest.raises(dedupe.ConfigurationError, match=r"unique_ttl must be at most"):
        task.apply_async_unique((1,), unique_ttl=float("inf"))


def test_a_plain_call_keeps_properties_of_its_own(
    app: Celery, queue_length: Callable[[Celery], int]
) -> None:
    plain = app.task(shared=False, name="loud.props")(_body)
    plain.apply_async((1,), report_kind="daily")
    assert queue_length(app) == 1


class _AnotherLibrarysBase(Task):  # type: ignore[type-arg]
    """A base of another dedup library whose options share our names (celery-singleton's
    Singleton has unique_on and on_duplicate)."""

    abstract = True
    unique_on: list[str] | None = None

    def on_duplicate(self, existing_task_id: str) -> None: ...


def test_a_task_of_another_librarys_base_keeps_the_options_that_base_owns(
    app: Celery, queue_length: Callable[[Celery], int]
) -> None:
    task = app.task(shared=False, name="loud.other", base=_AnotherLibrarysBase, unique_on=["x"])(
        _body
    )
    task.apply_async((1,))
    assert queue_length(app) == 1


def test_the_producer_guard_passes_over_a_method_another_librarys_base_names_like_an_option(
    app: Celery, queue_length: Callable[[Celery], int]
) -> None:
    # dedupe.apply_async on a celery-singleton task read Singleton.on_duplicate (a method) as
    # our on_duplicate option, and raised that it must be "return" or "raise".
    task = app.task(
        shared=False, name="loud.other_guarded", base=_AnotherLibrarysBase, unique_on=["x"]
    )(_body)
    assert dedupe.apply_async(task, (1,)).deduplicated is False
    assert dedupe.apply_async(task, (1,)).deduplicated is True
    assert queue_length(app) == 1


def test_an_option_given_as_a_plain_function_is_refused_by_name(app: Celery) -> None:
    task = app.task(shared=False, name="loud.function_option", on_duplicate=print)(_body)
    with pytest.raises(dedupe.ConfigurationError, match="on_duplicate must be"):
        dedupe.apply_async(task, (1,))


def test_a_dedupe_tasks_on_duplicate_written_as_a_method_is_refused(app: Celery) -> None:
    # On a DedupeTask every option is ours: a hook written as celery-singleton's is a mistake.
    class Hooked(dedupe.DedupeTask):  # type: ignore[misc]
        abstract = True

        def on_duplicate(self, existing_task_id: str) -> None: ...

    with pytest.raises(dedupe.ConfigurationError, match="on_duplicate must be"):
        app.task(shared=False, name="loud.hooked", base=Hooked, unique=True)(_body).delay(1)


def test_a_run_of_another_librarys_base_is_never_read_for_options_it_does_not_have(
    app: Celery,
) -> None:
    # A worker looks for a limit of a run whose message carries none (send_task, beat): only
    # a DedupeTask can have one. Read on this task, the base's on_duplicate (a method) was
    # an invalid option, and every run logged an error.
    task = app.task(
        shared=False, name="loud.other_run", base=_AnotherLibrarysBase, unique_on=["x"]
    )(_body)
    with Lines("dedupe", logging.WARNING) as said, in_process_worker(app):
        task.apply_async((1,)).get(timeout=10)
    # (About this task: the worker's start may warn of shared tasks other tests registered.)
    assert [line for line in said.lines if "loud.other_run" in line] == []


def test_the_router_that_refuses_them_routes_nothing(make_app: Callable[..., Celery]) -> None:
    app = make_app(task_routes={"loud.routed": {"queue": "elsewhere"}})
    options = app.amqp.router.route({}, "loud.routed")
    assert options["queue"].name == "elsewhere"


# -- settings: at install(), or logged when Celery reads them and raised at the first call -----

SETTINGS = [
    ({"dedupe_redis_url": 6379}, r"dedupe_redis_url must be a Redis URL .* got 6379 \(int\)"),
    (
        {"dedupe_redis_url": "http://localhost:6379"},
        r"starting with one of redis://, rediss://, unix://, sentinel://.*redis\+cluster://",
    ),
    (
        {"dedupe_redis_options": {"sockettimeout": 2}},
        r"'sockettimeout' is not an argument .* did you mean 'socket_timeout'\?",
    ),
    (
        {"dedupe_redis_options": {"socket_timeout": "2"}},
        r"socket_timeout must be a number; got '2' \(str\)",
    ),
    ({"dedupe_default_ttl": float("inf")}, r"dedupe_default_ttl must be at most"),
    ({"dedupe_default_lease": 1e16}, r"dedupe_default_lease must be at most"),
]


@pytest.mark.parametrize(("settings", "error"), SETTINGS, ids=[repr(s) for s, _ in SETTINGS])
def test_a_wrong_setting_is_refused_by_install_on_an_app_whose_settings_are_read(
    redis_url: str, settings: dict[str, Any], error: str
) -> None:
    app = Celery("loud", broker=redis_url, set_as_current=False)
    app.conf.update(settings)
    _ = app.conf.broker_url  # Celery reads the settings
    with pytest.raises(dedupe.ConfigurationError, match=error):
        dedupe.install(app)


def test_a_wrong_setting_read_after_install_is_logged_then_and_raised_at_the_first_call(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = Celery("loud_later", broker=redis_url, set_as_current=False)
    dedupe.install(app)  # (the settings are not read yet)
    app.config_from_object({"dedupe_redis_options": {"sockettimeout": 2}})
    task = app.task(base=dedupe.DedupeTask, shared=False, name="loud.later", unique=True)(_body)
    with caplog.at_level("ERROR", logger="dedupe.worker"):
        _ = app.conf.broker_url  # Celery reads the settings
    assert "did you mean 'socket_timeout'?" in caplog.text
    with pytest.raises(dedupe.ConfigurationError, match="did you mean 'socket_timeout'"):
        task.delay(1)


# -- the worker: refuses to start rather than run unique tasks unguarded ------------------------

WORKER_APP = """
from celery import Celery
import dedupe

app = Celery("loud_worker", broker="{broker}")
{settings}
dedupe.install(app)

@app.task({declaration})
def job(x=0): ...
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("broker", "settings", "declaration", "error"),
    [
        (
            "amqp://guest:guest@127.0.0.1:5672//",
            "",
            "base=dedupe.DedupeTask, unique=True",
            r"celery-dedupe needs a Redis server and the broker of app 'loud_worker' is not "
            r"one .*: set app\.conf\.dedupe_redis_url",
        ),
        (
            "{redis_url}",
            "",
            "unique=True",
            r"task 'loud_worker_app\.job': unique does nothing here",
        ),
    ],
    ids=["rabbitmq-without-a-dedup-redis", "a-plain-task-declared-unique"],
)
def test_a_worker_refuses_to_start_in_one_line_saying_what_to_set(
    tmp_path: Path, redis_url: str, broker: str, settings: str, declaration: str, error: str
) -> None:
    (tmp_path / "loud_worker_app.py").write_text(
        textwrap.dedent(
            WORKER_APP.format(
                broker=broker.format(redis_url=redis_url),
                settings=settings,
                declaration=declaration,
            )
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "loud_worker_app", "worker", "-P", "solo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("celery-dedupe:")]
    assert re.search(r"the worker of app 'loud_worker' cannot start: " + error, line), line


# -- the docs write imports that work -------------------------------------------------------


@pytest.mark.parametrize("module", ["prometheus", "django"])
def test_every_page_that_uses_a_submodule_says_how_to_import_it(module: str) -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    silent = [
        str(page.relative_to(ROOT))
        for page in pages
        if f"dedupe.{module}." in (text := page.read_text())
        and f"import dedupe.{module}" not in text
        and f"from dedupe.{module} import" not in text
        and f"::: dedupe.{module}" not in text
    ]
    assert silent == []


def _body(x: int = 0) -> None: ...


def test_checking_the_options_never_binds_celerys_own_task_class(redis_url: str) -> None:
    # Reading Celery's Task.app binds that base class to the current app, and every later task
    # then inherits what binding set there (acks_on_timeout among them): a fresh process.
    code = textwrap.dedent(
        f"""
        import celery
        from celery import Celery
        import dedupe

        app = Celery("bound", broker="{redis_url}", set_as_current=False)
        dedupe.install(app)

        @app.task(base=dedupe.DedupeTask, unique=True, acks_late=True)
        def job(x=0): ...

        @app.task
        def plain(x=0): ...

        job.delay(1)
        plain.apply_async((1,), report_kind="daily")
        assert not celery.Task.__bound__, "Celery's Task was bound"
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=ROOT)
