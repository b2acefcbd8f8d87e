"""Run the web view: the ASGI app under uvicorn, with what runs beside it (the switch that
turns the producers' and workers' event log on, and the count of live keys while a browser
looks).

``celery -A proj dedupe web`` calls :func:`serve`; the command checks the host first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from celery import Celery
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool

from dedupe.errors import DedupeError, RedisUnavailable
from dedupe.runs.runtime import runtime_of
from dedupe.store.redis_errors import redis_errors

from .app import View, make_app
from .recorder import CHECK_EVERY
from .security import LOOPBACK_NAMES, Guard, served_names

__all__ = ["SWITCH_TTL", "build", "serve"]

logger = logging.getLogger("dedupe.webview")

#: Seconds the event log stays on after the server last renewed its switch (a server that
#: dies turns it off within this; a running one renews it every third of it).
SWITCH_TTL = 30.0

_FAILURES: tuple[type[BaseException], ...] = (RedisUnavailable, DedupeError, *redis_errors)


def build(
    app: Celery,
    *,
    allow_clear: bool = False,
    refresh: float = 2.0,
    hosts: frozenset[str] = LOOPBACK_NAMES,
) -> tuple[View, Starlette]:
    """The view of ``app``'s keys and its ASGI app, with the switch and the count running
    while it is served; it answers only requests whose ``Host`` is one of ``hosts``
    (:func:`~dedupe.webview.security.served_names`).

    .. code-block:: python

        view, asgi = build(celery_app, allow_clear=True)
        uvicorn.run(asgi, host="127.0.0.1", port=9808)
    """
    runtime = runtime_of(app)
    config = runtime.config
    guard = Guard(
        token=config.web_token,
        basic=config.web_basic_auth,
        allow_clear=allow_clear,
        hosts=hosts,
    )
    view = View.of(app, runtime, guard, refresh)
    return view, make_app(view, lifespan=_lifespan(view))


def serve(
    app: Celery,
    *,
    host: str,
    port: int,
    allow_clear: bool = False,
    allowed_hosts: tuple[str, ...] = (),
    say: Callable[[str], Any] = print,
) -> None:
    """Serve the view of ``app``'s keys until interrupted (uvicorn handles the signals),
    under loopback names, ``host`` and ``allowed_hosts``."""
    view, asgi = build(app, allow_clear=allow_clear, hosts=served_names(host, allowed_hosts))
    where = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
    say(f"celery-dedupe web view of {app.main!r}: {where}/")
    if allow_clear:
        say(f"clearing keys is on: open {where}/?token={view.guard.clear_token} to clear")
    uvicorn.run(asgi, host=host, port=port, log_level="warning", lifespan="on")


def _lifespan(view: View) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # (On before the first request: the first page can show the events that follow.)
        since = time.time()
        with contextlib.suppress(*_FAILURES):
            await run_in_threadpool(view.log.switch_on, SWITCH_TTL, since)
        beside = [
            asyncio.create_task(_keep_switch_on(view, since)),
            asyncio.create_task(_count(view)),
        ]
        try:
            yield
        finally:
            for task in beside:
                task.cancel()
            # (Off now, not in SWITCH_TTL: the processes stop logging within CHECK_EVERY.)
            with contextlib.suppress(*_FAILURES):
                await run_in_threadpool(view.log.switch_off)

    return lifespan


async def _keep_switch_on(view: View, since: float) -> None:
    while True:
        await asyncio.sleep(min(SWITCH_TTL / 3, CHECK_EVERY * 2))
        try:
            await run_in_threadpool(view.log.switch_on, SWITCH_TTL, since)
        except _FAILURES as exc:
            logger.warning("web view: cannot turn the event log on: %s", exc)


async def _count(view: View) -> None:
    while True:
        # (Nobody looks: no reads at all, until the next request.)
        while not view.totals.watched:
            await asyncio.sleep(0.2)
        try:
            wait = await run_in_threadpool(view.totals.refresh)
        except _FAILURES as exc:
            logger.warning("web view: cannot count the live keys: %s", exc)
            wait = SWITCH_TTL / 3
        await asyncio.sleep(wait)
