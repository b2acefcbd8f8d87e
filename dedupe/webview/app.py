"""The web view's ASGI application (Starlette): two pages, the JSON API they read, and the
clear action. Served by :mod:`dedupe.webview.server`; tests and other ASGI servers may mount
:func:`make_app` themselves.

=================  ==================================================================
``GET /``          the live keys (filter by task and state), totals, a chart per task
``GET /key``       one key (``?name=``): its holder, its record, its task's last events
``GET /api/keys``  live keys from a cursor: ``?task=&q=&state=&sort=&after=&since=&cursor=&size=``
``POST /api/rows`` ``{"keys": [...]}``: the rows of the keys a page shows, read again
``GET /api/key``   one key and its task's last events: ``?name=``
``GET /api/stats`` live keys by task and state, accepted and deduplicated calls per minute
``GET /api/waiting`` the calls waiting for their turn (flow control): ``?task=``
``POST /api/clear`` ``{"key": ..., "holder": ...}``: frees the key if ``holder`` still holds it
=================  ==================================================================
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

import redis
from celery import Celery
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from dedupe.errors import DedupeError, RedisUnavailable
from dedupe.runs.inventory import task_of_key
from dedupe.runs.runtime import Runtime
from dedupe.store.redis_errors import redis_errors
from dedupe.store.view_log import ViewLog
from dedupe.values.keys import CallKeys, nodes_key, reaper_keys
from dedupe.values.urls import redacted

from .rows import SORTS, STATES, Find, key_page, key_row, key_rows
from .security import Guard
from .totals import Totals
from .waiting import Waiting

__all__ = ["View", "make_app"]

STATIC = Path(__file__).parent / "static"
#: The most keys one request reads.
MOST_PER_PAGE = 500
#: Minutes of accepted and deduplicated calls in each task's chart.
CHART_MINUTES = 10
#: Events shown on a key's page.
EVENTS_SHOWN = 50


@dataclass(frozen=True)
class View:
    """What one web view serves: the app's keys, its view log, the last totals, the guard."""

    app: Celery
    runtime: Runtime
    guard: Guard
    totals: Totals
    log: ViewLog
    #: The last readings of the calls waiting for their turn.
    waiting: Waiting
    #: Seconds between two refreshes of the page.
    refresh: float = 2.0

    @classmethod
    def of(cls, app: Celery, runtime: Runtime, guard: Guard, refresh: float = 2.0) -> View:
        """The view of an installed app's keys."""
        store, prefix = runtime.store, runtime.config.key_prefix
        log, waiting = ViewLog(store.client, prefix), Waiting(store, prefix)
        return cls(app, runtime, guard, Totals(app), log, waiting, refresh)

    @property
    def prefix(self) -> str:
        return self.runtime.config.key_prefix


def make_app(view: View, lifespan: Any = None) -> Starlette:
    """The ASGI app of ``view`` (``lifespan``: what runs beside it, see the server).

    .. code-block:: python

        app = make_app(View.of(celery_app, dedupe_runtime, Guard()))
        uvicorn.run(app, host="127.0.0.1", port=9808)
    """
    routes = [
        Route("/", _page("index.html", view)),
        Route("/key", _page("key.html", view)),
        Route("/api/keys", _api(view, _keys)),
        Route("/api/rows", _api(view, _rows), methods=["POST"]),
        Route("/api/key", _api(view, _key)),
        Route("/api/stats", _api(view, _stats)),
        Route("/api/waiting", _api(view, _waiting)),
        Route("/api/clear", _api(view, _clear), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(_Credentials, guard=view.guard)],
        lifespan=lifespan,
    )


class _Credentials(BaseHTTPMiddleware):
    """Every request names the server as it is served (its ``Host``), and shows its
    credentials when the settings ask for them."""

    def __init__(self, app: Any, guard: Guard) -> None:
        super().__init__(app)
        self.guard = guard

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        foreign = self.guard.refuses_host(request.headers)
        if foreign is not None:
            return JSONResponse({"error": foreign}, status_code=400)
        if self.guard.admits(request.headers):
            return await call_next(request)
        challenge = 'Basic realm="celery-dedupe"' if self.guard.basic else "Bearer"
        return JSONResponse(
            {"error": "credentials needed: see dedupe_web_token, dedupe_web_basic_auth"},
            status_code=401,
            headers={"WWW-Authenticate": challenge},
        )


def _page(name: str, view: View) -> Callable[[Request], Awaitable[Response]]:
    template = Template((STATIC / name).read_text(encoding="utf-8"))

    async def page(request: Request) -> Response:
        text = template.substitute(
            csrf=html.escape(view.guard.csrf_token),
            allow_clear="true" if view.guard.allow_clear else "false",
            refresh_ms=str(round(view.refresh * 1000)),
            prefix=html.escape(view.prefix),
        )
        return HTMLResponse(text, headers={"Cache-Control": "no-store"})

    return page


#: What says "the dedup Redis cannot answer" (or refused a command).
_UNREACHABLE: tuple[type[BaseException], ...] = (
    RedisUnavailable,
    redis.ResponseError,
    *redis_errors,
)

_Handler = Callable[[View, Request], tuple[int, dict[str, Any]]]


def _api(view: View, handler: _Handler) -> Callable[[Request], Awaitable[Response]]:
    """A JSON endpoint: the handler runs in a thread (redis-py blocks), and a Redis that is
    down is a 503 that says so, never a traceback."""

    async def endpoint(request: Request) -> Response:
        if request.method == "POST":
            request.state.body = await _json_body(request)
        try:
            status, body = await run_in_threadpool(handler, view, request)
        except BadInput as exc:
            status, body = 400, {"error": str(exc)}
        except _UNREACHABLE as exc:
            cause = exc.cause if isinstance(exc, RedisUnavailable) else exc
            status, body = 503, {"error": _unreachable(view, cause), "redis": "down"}
        except DedupeError as exc:
            status, body = 500, {"error": str(exc)}
        return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store"})

    return endpoint


async def _json_body(request: Request) -> dict[str, Any]:
    with contextlib.suppress(ValueError):
        body = await request.json()
        if isinstance(body, dict):
            return body
    return {}


def _unreachable(view: View, cause: BaseException) -> str:
    url = redacted(view.runtime.config.redis_url)
    if isinstance(cause, redis.ResponseError):
        return f"the dedup Redis at {url} refused a command ({type(cause).__name__}: {cause})"
    return f"cannot reach the dedup Redis at {url} ({type(cause).__name__}: {cause})"


#: SCAN's cursor is an unsigned 64-bit number: a larger one is the request's mistake.
MOST_CURSOR = 2**64 - 1
#: The longest task name or search text a request may give.
MOST_TEXT = 500


class BadInput(ValueError):
    """A request's parameter the view cannot take: a 400 that names it."""


def _integer(request: Request, name: str, default: int, least: int, most: int) -> int:
    text = request.query_params.get(name, "")
    if text == "":
        return default
    if not text.isdigit() or not least <= int(text) <= most:
        raise BadInput(f"{name} must be a whole number from {least} to {most}; got {text[:40]!r}")
    return int(text)


def _text(request: Request, name: str) -> str | None:
    text = request.query_params.get(name, "")
    if len(text) > MOST_TEXT:
        raise BadInput(f"{name} must be at most {MOST_TEXT} characters; got {len(text)}")
    return text or None


def _find(view: View, request: Request) -> Find:
    state = _text(request, "state")
    if state is not None and state not in STATES:
        raise BadInput(f"state must be one of {', '.join(STATES)}; got {state[:40]!r}")
    sort = _text(request, "sort") or ""
    if sort not in SORTS:
        raise BadInput(f"sort must be one of {', '.join(filter(None, SORTS))}; got {sort[:40]!r}")
    find = Find(task=_text(request, "task"), search=_text(request, "q"), state=state, sort=sort)
    after = _text(request, "after")
    if after is None:
        return find
    if not sort:
        raise BadInput("after goes with sort (a page in SCAN's order goes on by its cursor)")
    since_text = _text(request, "since") or ""
    try:
        since = float(since_text) if since_text else None
    except ValueError:
        raise BadInput(f"since must be a number (epoch seconds); got {since_text[:40]!r}") from None
    return dataclasses.replace(find, after=find.place_of(view.prefix, after, since))


def _keys(view: View, request: Request) -> tuple[int, dict[str, Any]]:
    page = key_page(
        view.runtime.store.client,
        view.prefix,
        _find(view, request),
        cursor=_integer(request, "cursor", 0, 0, MOST_CURSOR),
        size=_integer(request, "size", 200, 1, MOST_PER_PAGE),
    )
    now = time.time()
    return 200, {
        "keys": _marked(view, [row.as_json(now) for row in page.rows]),
        "cursor": page.cursor,
        "looked_at": page.looked_at,
        "read": page.read,
        "now": now,
    }


def _rows(view: View, request: Request) -> tuple[int, dict[str, Any]]:
    keys = request.state.body.get("keys")
    if (
        not isinstance(keys, list)
        or len(keys) > MOST_PER_PAGE
        or not all(isinstance(key, str) and len(key) <= MOST_TEXT for key in keys)
    ):
        raise BadInput(f'give {{"keys": [key names]}}, at most {MOST_PER_PAGE} of them')
    now = time.time()
    rows = key_rows(view.runtime.store.client, view.prefix, keys)
    return 200, {"keys": _marked(view, [row.as_json(now) for row in rows]), "now": now}


def _marked(view: View, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with its worker's node name and whether the reaper's last pass found its
    message gone (``no_message``: freed at its next pass); two reads, whatever the rows."""
    if not rows:
        return rows
    store = view.runtime.store
    nodes = store.nodes(nodes_key(view.prefix))
    gone = store.suspects(reaper_keys(view.prefix)[1])
    for row in rows:
        row["node"] = nodes.get(row["worker"]) if row["worker"] else None
        row["no_message"] = row["key"] in gone
    return rows


def _key(view: View, request: Request) -> tuple[int, dict[str, Any]]:
    name = _text(request, "name") or ""
    row = key_row(view.runtime.store.client, view.prefix, name)
    # (A freed key's page still shows its task's events.)
    task = row.task if row is not None else task_of_key(view.prefix, name)
    events = view.log.events(task, EVENTS_SHOWN) if task else []
    now = time.time()
    return 200, {
        "key": name,
        "row": row.as_json(now) if row is not None else None,
        "events": events,
        "view_log": view.log.is_on(),
        "now": now,
    }


def _stats(view: View, request: Request) -> tuple[int, dict[str, Any]]:
    view.totals.wanted()  # (the totals are counted while a page asks for them)
    count = view.totals.last
    tasks = sorted(set(count.by_task) | set(view.log.tasks()))
    chart = view.log.minutes(tasks, time.time(), CHART_MINUTES)
    return 200, {
        "totals": count.by_task,
        "counted_at": count.at,
        "count_took": round(count.took, 3),
        "chart": {task: [list(minute) for minute in minutes] for task, minutes in chart.items()},
        "now": time.time(),
    }


def _waiting(view: View, request: Request) -> tuple[int, dict[str, Any]]:
    # (The task filter is the keys' own: exactly this task's calls.)
    reading = view.waiting.read(_text(request, "task"))
    return 200, {**reading.as_json(), "now": time.time()}


def _clear(view: View, request: Request) -> tuple[int, dict[str, Any]]:
    refused = view.guard.refuses_clear(request.headers)
    if refused is not None:
        return 403, {"cleared": False, "error": refused}
    body: dict[str, Any] = request.state.body
    key, holder = body.get("key"), body.get("holder")
    if not isinstance(key, str) or not isinstance(holder, str) or not key or not holder:
        return 400, {"cleared": False, "error": 'give {"key": ..., "holder": task id}'}
    row = key_row(view.runtime.store.client, view.prefix, key)
    if row is None:
        return 404, {"cleared": False, "error": "the key is free already"}
    # Owner-checked in one script: freed only if the holder shown still holds it.
    freed = view.runtime.store.release(CallKeys(key, key), holder)
    if not freed:
        return 409, {"cleared": False, "error": f"the key is held by {row.holder} now"}
    note = "its run goes on; its heartbeat writes the key again" if row.state == "running" else ""
    return 200, {"cleared": True, "note": note}
