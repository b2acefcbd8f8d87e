"""The web view in a real browser: the distribution's headless Chromium, driven by Playwright
(``apt-get install chromium``; ``pip install playwright``, no browser download). Skipped when
either is missing, failed under CI=true.

``DEDUPE_SCREENSHOTS=docs/images`` saves the pages these tests see, for the docs.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import dedupe
from dedupe.runs.runtime import runtime_of
from dedupe.values.keys import format_call_key
from dedupe.values.record import HOST, pack_queued, pack_running
from dedupe.webview import recorder

from .conftest import in_process_worker
from .helpers import require
from .view_server import Served, served_view

pytest.importorskip("starlette", reason="the web extra: pip install 'celery-dedupe[web]'")

try:
    from playwright.sync_api import Browser, Page, expect, sync_playwright
except ImportError:  # pragma: no cover - the test extra is missing
    sync_playwright = None  # type: ignore[assignment]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOTS = os.environ.get("DEDUPE_SCREENSHOTS")
#: How long the page may take to show a change: its refresh (0.5 s here) and a margin.
SOON = 10_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    require(sync_playwright is not None, "no Playwright: pip install playwright")
    require(CHROMIUM is not None, "no Chromium: apt-get install chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 640})
    page = context.new_page()
    yield page
    context.close()


def snap(page: Page, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)


def unique_task(app: Celery, name: str, gate: threading.Event | None = None) -> Any:
    @app.task(shared=False, base=dedupe.DedupeTask, unique=True, name=name)
    def work(account: str) -> None:
        if gate is not None:
            gate.wait(30)

    return work


@pytest.fixture
def view_app(make_app: Callable[..., Celery], redis_factory: Any) -> Iterator[Celery]:
    # (Its events are kept for the view: the setting is off by default.)
    # (A Redis of its own: the suite's shared one holds other tests' keys by the thousand,
    # and a page reads only the first keys of a long list.)
    app = make_app(dedupe_redis_url=redis_factory().url, dedupe_web_events=True)
    yield app
    recorder.unwatch(app)  # (no look at its Redis while later tests count commands there)


def rows(page: Page) -> Any:
    return page.locator("#keys tbody tr")


def test_the_page_shows_three_held_calls_with_their_holders(view_app: Celery, page: Page) -> None:
    work = unique_task(view_app, "reports.refresh")
    with served_view(view_app) as served:
        # (Made while the view runs: the chart counts them, two of them duplicates.)
        ids = [work.delay(f"account-{n % 3}").id for n in range(5)][:3]
        page.goto(served.url + "/")
        expect(rows(page)).to_have_count(3, timeout=SOON)
        for task_id in ids:
            row = page.locator(f'#keys tbody tr[data-holder="{task_id}"]')
            expect(row).to_contain_text("queued")
            expect(row).to_contain_text("reports.refresh")
        totals = page.locator('#totals tr[data-task="reports.refresh"] td')
        expect(totals.nth(2)).to_have_text("3", timeout=SOON)  # (queued: a background count)
        expect(totals.nth(4)).to_contain_text("3 / 2", timeout=SOON)  # (accepted / duplicates)
        snap(page, "web-view-keys")


def test_the_filter_narrows_the_rows_and_a_refresh_keeps_it(view_app: Celery, page: Page) -> None:
    refresh, send = unique_task(view_app, "reports.refresh"), unique_task(view_app, "mail.send")
    for n in range(2):
        refresh.delay(n)
    mail = send.delay("ops@example.com")
    with served_view(view_app) as served:
        page.goto(served.url + "/")
        expect(rows(page)).to_have_count(3, timeout=SOON)
        page.fill("#task", "mail.send")
        page.click("#filter button")
        expect(rows(page)).to_have_count(1, timeout=SOON)
        expect(rows(page).first).to_have_attribute("data-holder", mail.id)
        page.reload()
        expect(page.locator("#task")).to_have_value("mail.send")
        expect(rows(page)).to_have_count(1, timeout=SOON)


def test_pause_holds_the_rows_until_resume(view_app: Celery, page: Page) -> None:
    work = unique_task(view_app, "reports.refresh")
    work.delay("first")
    with served_view(view_app) as served:
        page.goto(served.url + "/")
        expect(rows(page)).to_have_count(1, timeout=SOON)
        page.click("#pause")
        expect(page.locator("#status")).to_contain_text("paused")
        later = work.delay("second").id
        page.wait_for_timeout(4 * 500)  # (four refreshes' time)
        expect(rows(page)).to_have_count(1)
        page.click("#pause")
        expect(page.locator(f'#keys tbody tr[data-holder="{later}"]')).to_have_count(
            1, timeout=SOON
        )


def test_times_show_their_date(view_app: Celery, page: Page) -> None:
    work = unique_task(view_app, "reports.refresh")
    work.delay("eu")
    with served_view(view_app) as served:
        page.goto(served.url + "/")
        expect(rows(page)).to_have_count(1, timeout=SOON)
        since = rows(page).first.locator("td").nth(5)
        expect(since).to_have_text(re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} \("))


def open_with_token(page: Page, served: Served) -> None:
    page.goto(f"{served.url}/?token={served.view.guard.clear_token}")


def test_a_clear_with_the_token_frees_the_key_and_the_list_updates(
    view_app: Celery, page: Page
) -> None:
    work = unique_task(view_app, "reports.refresh")
    kept, cleared = work.delay("kept").id, work.delay("cleared").id
    with served_view(view_app, allow_clear=True) as served:
        open_with_token(page, served)
        expect(rows(page)).to_have_count(2, timeout=SOON)
        assert "token" not in page.url  # (taken out of the address bar)
        page.once("dialog", lambda dialog: dialog.accept())
        with page.expect_response("**/api/clear") as answer:
            page.locator(f'tr[data-holder="{cleared}"] button.clear').click()
        assert answer.value.status == 200
        expect(rows(page)).to_have_count(1, timeout=SOON)
        expect(rows(page).first).to_have_attribute("data-holder", kept)
        assert served.get("/api/keys").json()["keys"][0]["holder"] == kept


def test_a_clear_without_the_token_is_refused_with_403(view_app: Celery, page: Page) -> None:
    work = unique_task(view_app, "reports.refresh")
    held = work.delay("eu").id
    with served_view(view_app, allow_clear=True) as served:
        page.goto(served.url + "/")
        expect(rows(page)).to_have_count(1, timeout=SOON)
        page.once("dialog", lambda dialog: dialog.accept())
        with page.expect_response("**/api/clear") as answer:
            page.locator(f'tr[data-holder="{held}"] button.clear').click()
        assert answer.value.status == 403
        expect(page.locator("#status")).to_contain_text("not cleared (403)")
        expect(rows(page)).to_have_count(1)
        assert served.get("/api/keys").json()["keys"][0]["holder"] == held


def test_a_clear_asks_first_and_one_not_confirmed_sends_nothing(
    view_app: Celery, page: Page
) -> None:
    work = unique_task(view_app, "reports.refresh")
    held = work.delay("eu").id
    asked: list[str] = []
    cleared: list[str] = []
    with served_view(view_app, allow_clear=True) as served:
        open_with_token(page, served)
        expect(rows(page)).to_have_count(1, timeout=SOON)
        page.on("request", lambda request: cleared.append(request.url))
        page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
        page.locator(f'tr[data-holder="{held}"] button.clear').click()
        page.wait_for_timeout(1000)
        assert served.get("/api/keys").json()["keys"][0]["holder"] == held
    assert asked == [f"Free the key of reports.refresh held by {held}?"]
    assert not [url for url in cleared if "/api/clear" in url]


def test_a_run_ending_removes_its_row_at_the_next_refresh(view_app: Celery, page: Page) -> None:
    gate = threading.Event()
    work = unique_task(view_app, "reports.build", gate)
    with served_view(view_app) as served, in_process_worker(view_app):
        call = work.delay("eu")
        page.goto(served.url + "/")
        row = page.locator(f'#keys tbody tr[data-holder="{call.id}"]')
        expect(row).to_have_attribute("data-state", "running", timeout=SOON)
        expect(row).to_contain_text(f"{HOST}:{os.getpid()}")
        snap(page, "web-view-running")
        page.click(f'tr[data-holder="{call.id}"] a')
        expect(page.locator("#record")).to_contain_text(call.id, timeout=SOON)
        expect(page.locator("#events")).to_contain_text("run_claimed", timeout=SOON)
        snap(page, "web-view-key")
        page.go_back()
        expect(row).to_have_count(1, timeout=SOON)
        gate.set()
        call.get(timeout=10)
        expect(row).to_have_count(0, timeout=SOON)


def test_the_page_does_not_render_under_a_name_rebound_to_loopback(
    view_app: Celery, browser: Browser
) -> None:
    # A name an attacker's DNS first points at their server, then at 127.0.0.1: the browser
    # deems the view the attacker's origin. Chromium maps it to 127.0.0.1 itself here.
    work = unique_task(view_app, "reports.refresh")
    held = work.delay("eu").id
    # (A browser of its own: the flag is per launch.)
    rebinding = browser.browser_type.launch(
        executable_path=CHROMIUM,
        headless=True,
        args=["--host-resolver-rules=MAP rebind.attacker.test 127.0.0.1"],
    )
    try:
        page = rebinding.new_page()
        with served_view(view_app) as served:
            port = served.url.rsplit(":", 1)[1]
            answer = page.goto(f"http://rebind.attacker.test:{port}/")
            assert answer is not None
            assert answer.status == 400
            keys = page.evaluate("() => fetch('/api/keys').then((r) => String(r.status))")
            content = page.content()
    finally:
        rebinding.close()
    assert keys.startswith("400")
    assert held not in content
    assert 'id="keys"' not in content
    assert "csrf-token" not in content


def test_a_redis_that_is_down_gives_a_page_that_says_so(
    make_app: Callable[..., Celery], redis_factory: Any, page: Page
) -> None:
    server = redis_factory()
    app = make_app(dedupe_redis_url=server.url)
    with served_view(app) as served:
        server.stop()
        page.goto(served.url + "/")
        expect(page.locator("#status.down")).to_contain_text(
            f"cannot reach the dedup Redis at {server.url}", timeout=SOON
        )


# --- the calls waiting for their turn ------------------------------------------------------


@pytest.fixture
def lines_app(make_app: Callable[..., Celery], redis_factory: Any) -> Iterator[Celery]:
    # (The broker is the dedup Redis: a call over its key's limit waits held there.)
    url = redis_factory().url
    app = make_app(broker=url, dedupe_redis_url=url)
    yield app
    recorder.unwatch(app)


def limited_task(app: Celery, name: str) -> Any:
    @app.task(shared=False, base=dedupe.DedupeTask, name=name, key_concurrency=1)
    def work(account: str) -> None: ...

    return work


def waiting(page: Page) -> Any:
    return page.locator("#waiting tbody tr")


def test_the_calls_waiting_for_their_turn_show_their_place_and_when_they_are_due(
    lines_app: Celery, page: Page
) -> None:
    work = limited_task(lines_app, "reports.build")

    @lines_app.task(shared=False, base=dedupe.DedupeTask, name="mail.send", key_rate_limit="1/m")
    def send(to: str) -> None: ...

    handed, behind = work.delay("eu").id, work.delay("eu").id  # (no worker: none starts)
    planned = [send.delay("ops").id, send.delay("ops").id]
    with served_view(lines_app) as served:
        page.goto(served.url + "/")
        expect(waiting(page)).to_have_count(4, timeout=SOON)
        cells = [
            page.locator(f'#waiting tr[data-task-id="{task_id}"] td')
            for task_id in (handed, behind, *planned)
        ]
        expect(cells[0].nth(0)).to_have_text("reports.build")
        expect(cells[0].nth(4)).to_have_text("#1")
        expect(cells[0].nth(5)).to_have_text("handed")
        expect(cells[0].nth(6)).to_have_text("when a worker takes it")
        expect(cells[1].nth(4)).to_have_text("#2")
        expect(cells[1].nth(5)).to_have_text("waiting")
        expect(cells[1].nth(6)).to_have_text("when a slot frees")
        expect(cells[3].nth(3)).to_have_text("key_rate_limit")
        expect(cells[3].nth(4)).to_have_text("#2")
        expect(cells[3].nth(6)).to_have_text(
            re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} \(in (59|60|[1-5]\d) s\)$")
        )
        expect(page.locator("#waiting-found")).to_contain_text("4 calls wait")
        snap(page, "web-view-waiting")
        find(page, task="mail.send")
        expect(waiting(page)).to_have_count(2, timeout=SOON)


def test_the_waiting_calls_are_held_while_the_page_is_paused(lines_app: Celery, page: Page) -> None:
    work = limited_task(lines_app, "reports.build")
    work.delay("eu")
    with served_view(lines_app) as served:
        page.goto(served.url + "/")
        expect(waiting(page)).to_have_count(1, timeout=SOON)
        page.click("#pause")
        later = work.delay("eu").id
        page.wait_for_timeout(4 * 500)  # (four refreshes' time)
        expect(waiting(page)).to_have_count(1)
        page.click("#pause")
        expect(page.locator(f'#waiting tr[data-task-id="{later}"]')).to_have_count(1, timeout=SOON)


#: Markup in a task name and in a task id (a caller chooses both): shown as text, never run.
XSS_TASK = "<img src=x onerror=window.__xss=1>"
XSS_ID = "<img/src=x/onerror=window.__xss=2>"


def test_markup_in_a_waiting_calls_task_name_or_task_id_is_shown_as_text(
    lines_app: Celery, page: Page
) -> None:
    work = limited_task(lines_app, XSS_TASK)
    work.delay("eu")
    work.apply_async(("eu",), task_id=XSS_ID)
    with served_view(lines_app) as served:
        page.goto(served.url + "/")
        expect(waiting(page)).to_have_count(2, timeout=SOON)
        expect(waiting(page).nth(1).locator("td").nth(0)).to_have_text(XSS_TASK)
        expect(waiting(page).nth(1).locator("td").nth(2)).to_have_text(XSS_ID)
        page.wait_for_timeout(500)  # (an image's error would have fired by now)
        assert page.locator("#waiting img").count() == 0
        assert page.evaluate("() => window.__xss") is None


# --- every live key findable among many -------------------------------------------------

#: A walk of 100,000 keys on a shared 2-CPU machine: generous.
WALK = 60_000
BULK = "reports.refresh"
RARE = "billing.close_month"


def digest(n: int) -> str:
    return uuid.UUID(int=n).hex


def write_keys(app: Celery, records: list[tuple[str, str, bytes]]) -> None:
    """``(task, digest, record)`` written as the library writes them, by the thousand."""
    client = runtime_of(app).store.client
    prefix = app.conf.dedupe_key_prefix
    for start in range(0, len(records), 10_000):
        with client.pipeline(transaction=False) as pipe:
            for task, key_digest, record in records[start : start + 10_000]:
                pipe.set(format_call_key(prefix, task, key_digest), record, px=3_600_000)
            pipe.execute()


@pytest.fixture
def many_keys(view_app: Celery) -> dict[str, list[str]]:
    """100,000 queued keys of one task, 3 running ones, and 3 queued ones of a rare task:
    the holder ids of each kind."""
    now = time.time()
    bulk = [
        (BULK, digest(n), pack_queued(f"bulk-{n}", now - n % 600, None)) for n in range(100_000)
    ]
    running = [f"run-{uuid.uuid4()}" for _ in range(3)]
    rare = [f"rare-{uuid.uuid4()}" for _ in range(3)]
    write_keys(
        view_app,
        [
            *bulk,
            *(
                (BULK, digest(200_000 + n), pack_running(task_id, "t", "node-a", 4000 + n, now))
                for n, task_id in enumerate(running)
            ),
            *(
                (RARE, digest(300_000 + n), pack_queued(task_id, now, None))
                for n, task_id in enumerate(rare)
            ),
        ],
    )
    return {"running": running, "rare": rare}


def find(page: Page, **controls: str) -> None:
    for name, value in controls.items():
        if name in ("state", "sort"):
            page.select_option(f"#{name}", value)
        else:
            page.fill(f"#{name}", value)
    page.click("#filter button[type=submit]")


def holders(page: Page) -> set[str]:
    return set(rows(page).evaluate_all("(trs) => trs.map((tr) => tr.dataset.holder)"))


@pytest.mark.slow
def test_the_page_finds_the_3_running_keys_among_100000(
    view_app: Celery, many_keys: dict[str, list[str]], page: Page
) -> None:
    with served_view(view_app) as served:
        page.goto(served.url + "/")
        expect(rows(page)).to_have_count(200, timeout=WALK)
        find(page, state="running")
        expect(page.locator("#found")).to_contain_text("3 keys match (all looked at)", timeout=WALK)
        assert holders(page) == set(many_keys["running"])
        # The totals agree with the rows.
        running_total = page.locator(f'#totals tr[data-task="{BULK}"] td').nth(3)
        expect(running_total).to_have_text("3", timeout=WALK)


@pytest.mark.slow
def test_the_page_finds_the_3_keys_of_a_rare_task_among_100000(
    view_app: Celery, many_keys: dict[str, list[str]], page: Page
) -> None:
    with served_view(view_app) as served:
        page.goto(served.url + "/")
        find(page, task=RARE)
        expect(page.locator("#found")).to_contain_text("3 keys match (all looked at)", timeout=WALK)
        assert holders(page) == set(many_keys["rare"])
        queued_total = page.locator(f'#totals tr[data-task="{RARE}"] td').nth(2)
        expect(queued_total).to_have_text("3", timeout=WALK)


@pytest.mark.slow
def test_the_search_finds_a_key_by_its_holder_and_by_part_of_its_task_name(
    view_app: Celery, many_keys: dict[str, list[str]], page: Page
) -> None:
    wanted = many_keys["running"][1]
    with served_view(view_app) as served:
        page.goto(served.url + "/")
        find(page, q=wanted)
        expect(page.locator("#found")).to_contain_text(
            "1 key matches (all looked at)", timeout=WALK
        )
        assert holders(page) == {wanted}
        find(page, q="close_mon")
        expect(page.locator("#found")).to_contain_text("3 keys match (all looked at)", timeout=WALK)
        assert holders(page) == set(many_keys["rare"])


def test_next_page_walks_every_live_key_once(view_app: Celery, page: Page) -> None:
    now = time.time()
    ids = [f"call-{n}" for n in range(450)]
    write_keys(view_app, [(BULK, digest(n), pack_queued(i, now, None)) for n, i in enumerate(ids)])
    seen: list[str] = []
    pages = 0
    with served_view(view_app, refresh=60) as served:
        page.goto(served.url + "/")
        while True:
            pages += 1
            expect(page.locator("#page-number")).to_have_text(f"page {pages}", timeout=WALK)
            expect(rows(page).first).to_be_visible(timeout=WALK)
            seen += holders(page)
            if page.locator("#next").is_disabled():
                break
            page.click("#next")
    assert sorted(seen) == sorted(ids)
    assert pages >= 2


def test_a_sorted_page_orders_every_matching_key_not_only_one_pages(
    view_app: Celery, page: Page
) -> None:
    # 450 keys, the oldest written last: SCAN's order says nothing of their age.
    now = time.time()
    write_keys(
        view_app,
        [(BULK, digest(n), pack_queued(f"call-{n:03}", now - n, None)) for n in range(450)],
    )
    with served_view(view_app, refresh=60) as served:
        page.goto(served.url + "/")
        find(page, sort="oldest")
        expect(page.locator("#page-number")).to_have_text("page 1", timeout=WALK)
        expect(rows(page).first).to_have_attribute("data-holder", "call-449", timeout=WALK)
        page.click("#next")
        expect(page.locator("#page-number")).to_have_text("page 2", timeout=WALK)
        expect(rows(page).first).to_have_attribute("data-holder", "call-249", timeout=WALK)
        page.click("#next")
        expect(rows(page).first).to_have_attribute("data-holder", "call-049", timeout=WALK)
        expect(rows(page).last).to_have_attribute("data-holder", "call-000")
