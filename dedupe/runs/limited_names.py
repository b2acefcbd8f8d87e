"""The task names a worker knows as limited (``key_concurrency``, ``key_rate_limit``), kept in
the dedup Redis for the producers that call them by name without importing them: such a
call is published as the task's ``delay`` would publish it (every call accepted, its run
taking its turn), not deduplicated. A worker writes them as it starts and every
:data:`EVERY` seconds (again after the dedup Redis lost its data); a task that lost its
limit is taken out by the next worker that registers it.
"""

from __future__ import annotations

from dedupe.values.keys import limited_names_key
from dedupe.values.options import options_for

from .runtime import Runtime

__all__ = ["EVERY", "name_limited_tasks"]

#: Seconds between a worker's writes of its limited task names.
EVERY = 30.0

#: How long the names live without a worker to write them again: a day.
_TTL_MS = 24 * 3600 * 1000


def name_limited_tasks(runtime: Runtime) -> None:
    """Write which of the app's registered tasks are limited, and which are not."""
    limited: list[str] = []
    others: list[str] = []
    for name, task in list(runtime.app.tasks.items()):
        if name.startswith("celery."):
            continue  # (Celery's own)
        (limited if options_for(task, name, runtime.config).limited else others).append(name)
    key = limited_names_key(runtime.config.key_prefix)
    runtime.store.name_limited(key, limited, others, _TTL_MS)
