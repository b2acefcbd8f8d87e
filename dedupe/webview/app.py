"""The web view's ASGI application (Starlette): two pages, the JSON API they read, and the
clear action. Served by :mod:`dedupe.webview.server`; tests and other ASGI servers may mount
:func:`make_app` themselves.

=================  ==================================================================
``GET /``          the live keys (filter by task and state), totals, a chart per task
``GET /key``       one key (``?name=``): its holder, its record, its task's last events
``GET /api/keys``  a page of live keys: ``?task=&state=&cursor=&size=``
``GET /api/key``   one key and its task's last events: ``?name=``
``GET /api/stats`` live keys by task and state, accepted and deduplicated calls per minute
``POST /api/clear`` ``{"key": ..., "holder": ...}``: frees the key if ``holder`` still holds it
=================  ==================================================================
"""

from __future__ import annotations

import contextlib
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
from dedupe.values.keys import CallKeys
from dedupe.values.urls import redacted

from .rows import STATES, key_page, key_row
from .security import Guard
from .totals import Totals

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
    #: Seconds between two refreshes of the page.
    refresh: float = 2.0

    @classmethod
    def of(cls, app: Celery, runtime: Runtime, guard: Guard, refresh: float = 2.0) -> View:
        """The view of an installed app's keys."""
        prefix = runtime.config.key_prefix
        return cls(app, runtime, guard, Totals(app), ViewLog(runtime.store.client, prefix), refresh)

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
        Route("/api/key", _api(view, _key)),
        Route("/api/stats", _api(view, _stats)),
        Route("/api/clear", _api(view, _clear), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(_Credentials, guard=view.guard)],
        lifespan=lifespan,
    )


class _Credentials(BaseHTTPMiddleware):
    """Every request shows its credentials, when the settings ask for them."""

    def __init__(self, app: Any, guard: Guard) -> None:
        super().__init__(app)
        self.guard = guard

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
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


def _number(request: Request, name: str, default: int, most: int) -> int:
    try:
        return max(0, min(most, int(request.query_params.get(name, default))))
    except ValueError:
        return default


def _keys(view: View, request: Request) -> tuple[int, dict[str, Any]]:
    task = request.query_params.get("task") or None
    state = request.query_params.get("state") or None
    if state is not None and state not in STATES:
        return 400, {"error": f"state must be one of {', '.join(STATES)}; got {state!r}"}
    page = key_page(
        view.runtime.store.client,
        view.prefix,
        task=task,
        state=state,
        cursor=_number(request, "cursor", 0, 2**64),
        size=max(1, _number(request, "size", 200, MOST_PER_PAGE)),
    )
    now = time.time()
    return 200, {
        "keys": [row.as_json(now) for row in page.rows],
        "cursor": page.cursor,
        "now": now,
    }


def _key(view: View, request: Request) -> tuple[int, dict[str, Any]]:
    name = request.query_params.get("name", "")
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
