"""Every option and every setting of celery-dedupe, in one list each.

Validation reads the names from here (:mod:`dedupe.values.options`,
:mod:`dedupe.values.config`), and tests/test_option_docs.py checks that the docs' tables and
the docstrings that list options name each one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from . import defaults

__all__ = [
    "OPTIONS",
    "SETTINGS",
    "SETTING_PREFIX",
    "Option",
    "Setting",
    "Where",
]

#: Where an option may be given: on the task only (``@app.task(base=DedupeTask, ...)``), or
#: also per call (``apply_async_unique(..., unique_ttl=60)``, where the call's value wins).
Where = Literal["task", "task or call"]


@dataclass(frozen=True, slots=True)
class Option:
    """One dedup option of a task (and maybe of a call)."""

    name: str
    where: Where
    meaning: str
    #: As the docs write it.
    default: str
    #: Flow control per key: every call is accepted and runs in turn (nothing is a duplicate).
    flow_control: bool = False


@dataclass(frozen=True, slots=True)
class Setting:
    """One app-wide setting, read from ``app.conf``."""

    name: str
    meaning: str
    #: As the docs write it.
    default: str


# The order is the one error messages list the options in.
OPTIONS: tuple[Option, ...] = (
    Option("unique", "task", "deduplicate every call, not only the *_unique ones", "False"),
    Option(
        "exclusive",
        "task",
        "the execution guard alone: calls are not deduplicated, runs never overlap",
        "False",
    ),
    Option(
        "unique_on",
        "task or call",
        "names of the arguments that make calls the same",
        "all arguments",
    ),
    Option(
        "unique_key",
        "task or call",
        "callable(*args, **kwargs) returning the value to deduplicate on",
        "none",
    ),
    Option(
        "unique_ttl",
        "task or call",
        "seconds a queued record lives, plus any countdown",
        f"dedupe_default_ttl ({defaults.TTL:g})",
    ),
    Option(
        "unique_until",
        "task or call",
        'how long a call is a duplicate: "finished", "started" or "window"',
        '"finished" ("started" with debounce)',
    ),
    Option(
        "on_duplicate",
        "task or call",
        'a duplicate call: "return" the holder\'s result, "raise" AlreadyQueued, or "replace"',
        '"return"',
    ),
    Option(
        "debounce",
        "task or call",
        "seconds of quiet after a burst's last call before its one run",
        "none",
    ),
    Option(
        "debounce_max_wait",
        "task or call",
        "seconds after a burst's first call by which its run starts",
        "none",
    ),
    Option(
        "unique_lease",
        "task",
        "seconds a run holds its key between heartbeats",
        f"dedupe_default_lease ({defaults.LEASE:g})",
    ),
    Option(
        "on_running",
        "task",
        'a run that meets another run of its key: "skip" it or "retry" it later',
        '"skip" ("retry" for an exclusive task)',
    ),
    Option(
        "on_running_countdown",
        "task",
        "seconds before such a run is tried again the first time",
        f"{defaults.RUNNING_COUNTDOWN:g}",
    ),
    Option(
        "key_concurrency",
        "task",
        "at most N runs of one key at once, the other calls in turn",
        "none",
        flow_control=True,
    ),
    Option(
        "key_rate_limit",
        "task",
        'at most N starts of one key per period ("2/s", "10/m", "100/h")',
        "none",
        flow_control=True,
    ),
)

#: Every setting's name starts with this (Django's ``namespace="CELERY"`` loading keeps it
#: upper-case: ``DEDUPE_REDIS_URL``).
SETTING_PREFIX = "dedupe_"

SETTINGS: tuple[Setting, ...] = (
    Setting("dedupe_redis_url", "the dedup store's Redis", "the broker's URL when it is Redis"),
    Setting(
        "dedupe_redis_options",
        "extra arguments of the dedup store's Redis client",
        "short timeouts, 2 retries",
    ),
    Setting("dedupe_key_prefix", "the first part of every key", f'"{defaults.KEY_PREFIX}"'),
    Setting("dedupe_default_ttl", "the default unique_ttl", f"{defaults.TTL:g}"),
    Setting("dedupe_default_lease", "the default unique_lease", f"{defaults.LEASE:g}"),
    Setting(
        "dedupe_on_redis_error",
        'the dedup Redis out of reach: "enqueue" anyway, or "raise"',
        f'"{defaults.ON_REDIS_ERROR}"',
    ),
    Setting(
        "dedupe_busy_poll_us",
        "microseconds to poll for a Redis reply before sleeping for it (a prefork pool's "
        "process: none unless set)",
        f"{defaults.BUSY_POLL_US}",
    ),
    Setting(
        "dedupe_provisional_ttl",
        "seconds the record of a call being published lives until the publish returns",
        f"{defaults.PROVISIONAL_TTL:g}",
    ),
    Setting(
        "dedupe_remember_duplicates",
        "seconds a thread may answer a repeated duplicate from memory",
        f"{defaults.REMEMBER_DUPLICATES:g}",
    ),
    Setting(
        "dedupe_call_budget",
        "seconds one call may wait on the dedup Redis in all, retries included",
        f"{defaults.CALL_BUDGET:g}",
    ),
    Setting(
        "dedupe_deferral_cap",
        "the longest wait between two tries of a run that met its key held",
        f"{defaults.DEFERRAL_CAP:g}",
    ),
    Setting(
        "dedupe_max_deferrals",
        "deferrals of one message before it gives up",
        f"{defaults.MAX_DEFERRALS}",
    ),
    Setting(
        "dedupe_reap_interval",
        "seconds between two passes of the workers' reaper (0: no reaper)",
        f"{defaults.REAP_INTERVAL:g}",
    ),
    Setting(
        "dedupe_reap_margin",
        "the age under which a queued record is never reaped",
        f"{defaults.REAP_MARGIN:g}",
    ),
    Setting("dedupe_web_token", "the bearer token celery dedupe web asks for", "none"),
    Setting("dedupe_web_basic_auth", '"user:password" that celery dedupe web asks for', "none"),
    Setting(
        "dedupe_web_events",
        "keep this process's events for a running celery dedupe web",
        "False",
    ),
)
