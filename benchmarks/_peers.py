"""The peers measured beside dedupe: celery-once and celery-singleton, when installed (the
bench extra), each keeping its locks in the Redis given whatever the broker.

Both take their lock when the call is made and release it in the worker after the run
(celery-once's ``after_return``, celery-singleton's ``on_success``), before Celery's
``task_postrun`` signal: a worker benchmark that times runs to that signal times the release.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

#: Each peer's name and the pattern of its lock keys.
ONCE, SINGLETON = "celery-once", "celery-singleton"
LOCKS = {ONCE: "qo_*", SINGLETON: "SINGLETONLOCK_*"}


def configure(app: Celery, redis_url: str) -> None:
    """Both peers' settings on ``app``: their locks in ``redis_url``."""
    app.conf.ONCE = {
        "backend": "celery_once.backends.Redis",
        "settings": {"url": redis_url, "default_timeout": 3600},
    }
    app.conf.singleton_backend_url = redis_url


def tasks(app: Celery, **options: Any) -> dict[str, Any]:
    """A no-op task ``(x: int)`` of each installed peer on ``app`` (configured first), by
    peer name; ``options`` go to every ``app.task``."""
    found: dict[str, Any] = {}
    try:
        from celery_once import QueueOnce
    except ImportError:
        pass
    else:
        # graceful: a duplicate returns instead of raising, as dedupe's does.
        @app.task(shared=False, base=QueueOnce, once={"graceful": True}, **options)
        def once_task(x: int) -> None: ...

        found[ONCE] = once_task
    try:
        from celery_singleton import Singleton
    except ImportError:
        pass
    else:

        @app.task(shared=False, base=Singleton, **options)
        def singleton_task(x: int) -> None: ...

        found[SINGLETON] = singleton_task
    return found
