"""``celery dedupe web``: its JSON API, its clear action and its guards, against a real Redis
and the server uvicorn runs (the pages themselves, in a browser: test_web_view_browser.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

import dedupe
from dedupe.cli import dedupe as dedupe_cli
from dedupe.runs.runtime import runtime_of
from dedupe.store.view_log import ViewLog
from dedupe.values.keys import call_keys, format_call_key
from dedupe.values.record import pack_queued, pack_running
from dedupe.webview import recorder, rows, totals
from dedupe.webview.rows import KeyRow

from .helpers import ServerProcess, wait_for
from .view_server import PRODUCER_APP, served_view, web_app_env

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("starlette", reason="the web extra: pip install 'celery-dedupe[web]'")

SECRET = "hunter2-account-4711"


def unique_tasks(app: Celery) -> tuple[Any, Any]:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="reports.refresh")
    def refresh(account: str) -> str:
        return account

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name="mail.send")
    def send(to: str) -> str:
        return to

    return refresh, send


@pytest.fixture
def view_app(make_app: Callable[..., Celery], redis_factory: Any) -> Iterator[Celery]:
    # No worker consumes its queue: every call stays queued, holding its key. Its events are
    # kept for the view (the setting is off by default).
    # (A Redis of its own: the suite's shared one holds other tests' keys by the thousand,
    # and a page reads only the first keys of a long list.)
    app = make_app(dedupe_redis_url=redis_factory().url, dedupe_web_events=True)
    yield app
    recorder.unwatch(app)  # (no look at its Redis while later tests count commands there)


def test_a_row_reads_its_task_digest_and_kind_of_key_from_the_key_name() -> None:
    digest = "0123456789abcdef" * 2
    keys = call_keys("dedupe", "reports:eu}", digest, separate_run_lock=True)
    raw = pack_queued("a", 5.0, None)
    rows = [KeyRow.of("dedupe", key, raw, 900) for key in (keys.call, keys.run)]
    assert [(row.task, row.digest, row.run_lock) for row in rows if row is not None] == [
        ("reports:eu}", digest, False),
        ("reports:eu}", digest, True),
    ]


def test_the_keys_api_lists_each_held_call_with_its_holder(view_app: Celery) -> None:
    refresh, _ = unique_tasks(view_app)
    ids = {refresh.delay(f"account-{n}").id for n in range(3)}
    with served_view(view_app) as served:
        keys = served.get("/api/keys").json()["keys"]
    assert {row["holder"] for row in keys} == ids
    assert {(row["task"], row["state"]) for row in keys} == {("reports.refresh", "queued")}
    assert all(0 < row["ttl"] <= 3600 and row["age"] >= 0 for row in keys)


def test_the_keys_api_filters_by_task_and_by_state(view_app: Celery) -> None:
    refresh, send = unique_tasks(view_app)
    refresh.delay("a")
    mail = send.delay("b")
    with served_view(view_app) as served:
        by_task = served.get("/api/keys", params={"task": "mail.send"}).json()["keys"]
        running = served.get("/api/keys", params={"state": "running"}).json()["keys"]
        bad = served.get("/api/keys", params={"state": "stuck"})
    assert [row["holder"] for row in by_task] == [mail.id]
    assert running == []
    assert bad.status_code == 400


def test_the_keys_api_reads_a_page_per_request_and_a_cursor_goes_on(view_app: Celery) -> None:
    refresh, _ = unique_tasks(view_app)
    # Enough keys that no page covers most of them: a scan step visits whole hash buckets, and
    # during Redis's incremental rehash both tables' (30 keys came back in 2 pages once).
    ids = {refresh.delay(f"account-{n}").id for n in range(120)}
    seen: list[str] = []
    pages = 0
    with served_view(view_app) as served:
        cursor = None
        while cursor != 0:
            answer = served.get("/api/keys", params={"size": 5, "cursor": cursor or 0}).json()
            # A page, never the keyspace. (SCAN's COUNT is a hint, and a bucket's keys come
            # together: a page of 5 came back with 11 keys once, so no tighter bound holds.)
            assert len(answer["keys"]) < len(ids)
            seen += [row["holder"] for row in answer["keys"]]
            cursor, pages = answer["cursor"], pages + 1
    assert set(seen) == ids
    assert pages > 2


@pytest.mark.parametrize(
    ("params", "word"),
    [
        ({"cursor": str(2**64)}, "cursor must be a whole number from 0 to 18446744073709551615"),
        ({"cursor": "-1"}, "cursor must be"),
        ({"cursor": "abc"}, "cursor must be"),
        ({"size": "0"}, "size must be a whole number from 1 to 500"),
        ({"size": "501"}, "size must be"),
        ({"size": "1e3"}, "size must be"),
        ({"state": "stuck"}, "state must be one of provisional, queued, running"),
        ({"task": "t" * 501}, "task must be at most 500 characters"),
    ],
)
def test_a_bad_parameter_is_a_400_that_names_it(
    view_app: Celery, params: dict[str, str], word: str
) -> None:
    with served_view(view_app) as served:
        answer = served.get("/api/keys", params=params)
    assert answer.status_code == 400
    assert word in answer.json()["error"]


def test_the_stats_api_counts_live_keys_by_task_and_state(view_app: Celery) -> None:
    refresh, send = unique_tasks(view_app)
    for n in range(3):
        refresh.delay(n)
    send.delay("x")
    with served_view(view_app) as served:
        stats = wait_for(
            lambda: (answer := served.get("/api/stats").json())["counted_at"] and answer,
            message="the first count",
        )
    assert stats["totals"] == {"mail.send": {"queued": 1}, "reports.refresh": {"queued": 3}}


def reads(client: Any) -> dict[str, int]:
    """Commands of each kind the server has answered (INFO commandstats)."""
    stats = client.info("commandstats")
    return {name[len("cmdstat_") :]: int(stat["calls"]) for name, stat in stats.items()}


def key_reads(before: dict[str, int], after: dict[str, int]) -> int:
    return sum(after.get(c, 0) - before.get(c, 0) for c in ("scan", "get", "pttl", "mget"))


def test_the_server_reads_no_key_while_no_page_looks(
    make_app: Callable[..., Celery], redis_factory: Any
) -> None:
    app = make_app(dedupe_redis_url=redis_factory().url)
    refresh, _ = unique_tasks(app)
    refresh.delay("eu")
    client = runtime_of(app).store.client
    with served_view(app) as served:
        before = reads(client)
        time.sleep(3 * totals.EVERY)  # (a count in the background would come every EVERY s)
        idle = key_reads(before, reads(client))
        served.get("/api/stats")
        wait_for(lambda: served.view.totals.last.at is not None, message="a count once asked")
    assert idle == 0
    assert key_reads(before, reads(client)) > 0


def test_a_filtered_request_reads_a_bounded_stretch_and_the_cursor_finds_the_rest(
    view_app: Celery,
) -> None:
    client = runtime_of(view_app).store.client
    prefix = view_app.conf.dedupe_key_prefix
    now = time.time()
    with client.pipeline(transaction=False) as pipe:
        for n in range(30_000):
            key = format_call_key(prefix, "reports.refresh", f"{n:032x}")
            pipe.set(key, pack_queued(f"q-{n}", now, None), px=600_000)
        running = format_call_key(prefix, "reports.refresh", "f" * 32)
        pipe.set(running, pack_running("the-run", "t", "node-a", 7, now), px=600_000)
        pipe.execute()
    found, requests, cursor, most_gets = [], 0, 0, 0
    with served_view(view_app) as served:
        while True:
            before = reads(client)
            answer = served.get("/api/keys", params={"state": "running", "cursor": cursor}).json()
            most_gets = max(most_gets, reads(client)["get"] - before.get("get", 0))
            found += [row["holder"] for row in answer["keys"]]
            cursor, requests = answer["cursor"], requests + 1
            if cursor == 0:
                break
    assert found == ["the-run"]
    assert requests > 1
    assert most_gets <= rows.READ_AT_MOST + rows.SCAN_COUNT


def test_a_keys_page_shows_its_record_and_the_last_events_of_its_task(view_app: Celery) -> None:
    refresh, _ = unique_tasks(view_app)
    with served_view(view_app) as served:
        first = refresh.delay("eu")
        refresh.delay("eu")  # a duplicate
        key = served.get("/api/keys").json()["keys"][0]["key"]
        # (Written by the recorder's thread, a moment after the calls.)
        wait_for(
            lambda: len(served.get("/api/key", params={"name": key}).json()["events"]) == 2,
            message="the two events logged",
        )
        answer = served.get("/api/key", params={"name": key}).json()
    assert answer["row"]["holder"] == first.id
    assert [event["event"] for event in answer["events"]] == [
        "call_deduplicated",
        "call_accepted",
    ]
    assert answer["events"][0]["holder"] == first.id


def test_the_chart_counts_accepted_and_deduplicated_calls_per_minute(view_app: Celery) -> None:
    refresh, _ = unique_tasks(view_app)
    with served_view(view_app) as served:
        for _ in range(3):
            refresh.delay("eu")

        def counted() -> tuple[int, int, int]:
            chart = served.get("/api/stats").json()["chart"].get("reports.refresh", [])
            return len(chart), sum(m[1] for m in chart), sum(m[2] for m in chart)

        # (Minutes shown, accepted, deduplicated; written by the recorder's thread.)
        wait_for(lambda: counted() == (10, 1, 2), message="1 accepted and 2 duplicates")


PRODUCER = (
    PRODUCER_APP
    + """
for n in range(4):
    refresh.delay(os.environ["WHO"] + str(n))
    refresh.delay(os.environ["WHO"] + str(n))  # a duplicate
print("made 4 accepted and 4 duplicate calls")
"""
)


def test_the_chart_counts_every_call_of_two_producers_that_exit_at_once(view_app: Celery) -> None:
    # Fresh processes: their first calls come before their recorder's first look at the
    # switch, their last just before they exit.
    env = web_app_env(view_app)
    with served_view(view_app) as served:
        producers = [
            subprocess.Popen(
                [sys.executable, "-c", PRODUCER],
                env={**env, "WHO": who},
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for who in ("a", "b")
        ]
        outputs = [producer.communicate(timeout=60) for producer in producers]
        assert [producer.returncode for producer in producers] == [0, 0], outputs
        chart = served.get("/api/stats").json()["chart"]["reports.refresh"]
    assert (sum(m[1] for m in chart), sum(m[2] for m in chart)) == (8, 8)


def test_events_are_logged_only_while_a_view_runs(view_app: Celery) -> None:
    refresh, _ = unique_tasks(view_app)
    log = ViewLog(runtime_of(view_app).store.client, view_app.conf.dedupe_key_prefix)
    refresh.delay("before")
    with served_view(view_app):
        refresh.delay("during")
    refresh.delay("after")
    assert [event["event"] for event in log.events("reports.refresh", 10)] == ["call_accepted"]
    assert not log.is_on()


def test_a_process_keeps_no_events_unless_its_app_sets_dedupe_web_events(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app()
    refresh, _ = unique_tasks(app)
    log = ViewLog(runtime_of(app).store.client, app.conf.dedupe_key_prefix)
    with served_view(app):
        refresh.delay("during")
        time.sleep(3 * recorder.FLUSH_EVERY)  # (what a recorder would have written by now)
    assert log.events("reports.refresh", 10) == []
    assert not recorder.listening_to(app.conf.dedupe_key_prefix)


def test_no_argument_value_is_shown_anywhere(view_app: Celery) -> None:
    refresh, _ = unique_tasks(view_app)
    with served_view(view_app) as served:
        refresh.delay(SECRET)
        refresh.delay(SECRET)
        key = served.get("/api/keys").json()["keys"][0]["key"]
        answers = [
            served.get(path).text
            for path in ("/", "/api/keys", "/api/stats", f"/key?name={key}", f"/api/key?name={key}")
        ]
    assert all(SECRET not in text for text in answers)


def test_a_redis_that_is_down_is_a_503_that_says_so(
    make_app: Callable[..., Celery], redis_factory: Any
) -> None:
    server = redis_factory()
    app = make_app(dedupe_redis_url=server.url)
    with served_view(app) as served:
        server.stop()
        answer = served.get("/api/keys")
        page = served.get("/")
    assert answer.status_code == 503
    assert answer.json()["error"].startswith(f"cannot reach the dedup Redis at {server.url}")
    assert page.status_code == 200  # (the page shows the API's error: see the browser tests)


def test_clear_frees_the_key_when_the_holder_shown_still_holds_it(view_app: Celery) -> None:
    refresh, _ = unique_tasks(view_app)
    call = refresh.delay("eu")
    with served_view(view_app, allow_clear=True) as served:
        key = served.get("/api/keys").json()["keys"][0]["key"]
        answer = served.clear(key, call.id)
        left = served.get("/api/keys").json()["keys"]
    assert (answer.status_code, answer.json()["cleared"]) == (200, True)
    assert left == []


def test_clear_of_a_key_another_call_holds_now_is_refused(view_app: Celery) -> None:
    refresh, _ = unique_tasks(view_app)
    refresh.delay("eu")
    with served_view(view_app, allow_clear=True) as served:
        key = served.get("/api/keys").json()["keys"][0]["key"]
        answer = served.clear(key, "the-holder-the-page-showed-before")
        left = served.get("/api/keys").json()["keys"]
    assert answer.status_code == 409
    assert [row["key"] for row in left] == [key]


@pytest.mark.parametrize(
    ("token", "csrf", "reason"),
    [(False, True, "no clear token"), (True, False, "CSRF"), (False, False, "no clear token")],
)
def test_clear_without_the_clear_token_or_the_csrf_token_is_refused(
    view_app: Celery, token: bool, csrf: bool, reason: str
) -> None:
    refresh, _ = unique_tasks(view_app)
    call = refresh.delay("eu")
    with served_view(view_app, allow_clear=True) as served:
        key = served.get("/api/keys").json()["keys"][0]["key"]
        answer = served.clear(key, call.id, token=token, csrf=csrf)
        left = served.get("/api/keys").json()["keys"]
    assert answer.status_code == 403
    assert reason in answer.json()["error"]
    assert len(left) == 1


def test_clear_from_another_origin_is_refused(view_app: Celery) -> None:
    refresh, _ = unique_tasks(view_app)
    call = refresh.delay("eu")
    with served_view(view_app, allow_clear=True) as served:
        key = served.get("/api/keys").json()["keys"][0]["key"]
        guard = served.view.guard
        answer = httpx.post(
            served.url + "/api/clear",
            json={"key": key, "holder": call.id},
            headers={
                "Origin": "http://evil.example",
                "X-Dedupe-Clear-Token": guard.clear_token,
                "X-CSRF-Token": guard.csrf_token,
            },
        )
    assert answer.status_code == 403


def test_clear_is_refused_by_a_server_started_without_allow_clear(view_app: Celery) -> None:
    refresh, _ = unique_tasks(view_app)
    call = refresh.delay("eu")
    with served_view(view_app) as served:
        key = served.get("/api/keys").json()["keys"][0]["key"]
        answer = served.clear(key, call.id)
    assert answer.status_code == 403
    assert "--allow-clear" in answer.json()["error"]


def test_a_bearer_token_setting_keeps_out_requests_without_it(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app(dedupe_web_token="t0ken-of-sixteen-chars")
    with served_view(app) as served:
        without = served.get("/api/keys")
        wrong = served.get("/api/keys", headers={"Authorization": "Bearer nope"})
        right = served.get("/api/keys", headers={"Authorization": "Bearer t0ken-of-sixteen-chars"})
    assert (without.status_code, wrong.status_code, right.status_code) == (401, 401, 200)


def test_a_basic_auth_setting_lets_in_its_user_and_no_one_else(
    make_app: Callable[..., Celery],
) -> None:
    app = make_app(dedupe_web_basic_auth="ops:s3cret")
    with served_view(app) as served:
        without = served.get("/")
        wrong = served.get("/", auth=("ops", "guess"))
        right = served.get("/", auth=("ops", "s3cret"))
    assert without.status_code == 401
    assert without.headers["WWW-Authenticate"].startswith("Basic")
    assert (wrong.status_code, right.status_code) == (401, 200)


@pytest.mark.parametrize(
    "path", ["/", "/key?name=x", "/api/keys", "/api/stats", "/api/waiting", "/static/view.js"]
)
def test_a_request_under_a_foreign_host_name_gets_400(view_app: Celery, path: str) -> None:
    with served_view(view_app) as served:
        port = served.url.rsplit(":", 1)[1]
        foreign = served.get(path, headers={"Host": f"rebind.attacker.test:{port}"})
        loopback = served.get(path, headers={"Host": f"localhost:{port}"})
    assert foreign.status_code == 400
    assert "unknown Host rebind.attacker.test" in foreign.text
    assert loopback.status_code == 200


def test_a_name_given_by_allowed_host_is_served(view_app: Celery) -> None:
    with served_view(view_app, allowed_hosts=("dedupe.ops.internal",)) as served:
        allowed = served.get("/api/keys", headers={"Host": "dedupe.ops.internal:9808"})
        other = served.get("/api/keys", headers={"Host": "other.ops.internal:9808"})
    assert (allowed.status_code, other.status_code) == (200, 400)


def run_cli(app: Celery, *args: str, **env: str) -> Any:
    context = CLIContext(app=app, no_color=True, workdir=None, quiet=False)
    return CliRunner().invoke(dedupe_cli, list(args), obj=context, env=env)


def test_a_non_loopback_host_from_the_environment_is_refused(view_app: Celery) -> None:
    result = run_cli(view_app, "web", DEDUPE_WEB_HOST="0.0.0.0")
    assert result.exit_code == 2
    assert "give --host 0.0.0.0 on the command line" in result.output


@pytest.mark.slow
def test_a_non_loopback_host_given_by_host_is_served(redis_url: str) -> None:
    server = ServerProcess(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.worker_app",
            "dedupe",
            "web",
            "--host",
            "0.0.0.0",
            "--port",
            "{port}",
        ],
        env={"DEDUPE_TEST_REDIS": redis_url},
    )
    server.start("/api/stats")
    try:
        assert httpx.get(server.url + "/api/keys").status_code == 200
        assert "without credentials" in server.tail()
    finally:
        server.stop()


@pytest.mark.slow
def test_the_web_command_answers_only_its_names_and_those_of_allowed_host(
    redis_url: str,
) -> None:
    command = [sys.executable, "-m", "celery", "-A", "tests.worker_app", "dedupe", "web"]
    server = ServerProcess(
        [*command, "--port", "{port}", "--allowed-host", "dedupe.ops.internal"],
        env={"DEDUPE_TEST_REDIS": redis_url},
    )
    server.start("/api/stats")
    try:
        codes = {
            name: httpx.get(server.url + "/", headers={"Host": f"{name}:{server.port}"}).status_code
            for name in ("rebind.attacker.test", "dedupe.ops.internal", "localhost", "127.0.0.1")
        }
    finally:
        server.stop()
    assert codes == {
        "rebind.attacker.test": 400,
        "dedupe.ops.internal": 200,
        "localhost": 200,
        "127.0.0.1": 200,
    }


def test_the_commands_load_without_the_web_extra_which_the_web_command_names() -> None:
    # As if uvicorn were not installed (a process of its own: imports cannot be undone).
    source = (
        "import sys; sys.modules['uvicorn'] = None\n"
        "from click.testing import CliRunner\n"
        "import dedupe.cli\n"
        "result = CliRunner().invoke(dedupe.cli.dedupe, ['web'], obj=None)\n"
        "print(result.exit_code, result.output)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    code, _, output = done.stdout.partition(" ")
    assert code == "1"
    assert "celery dedupe web needs uvicorn" in output
    assert "pip install 'celery-dedupe[web]'" in output
