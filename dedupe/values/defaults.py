"""Every default value of celery-dedupe, in one table.

The settings (``dedupe_*``), the task and call options (``unique_*``) and the Redis clients
all take their defaults from here, so a default is changed in one place.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "ASYNC_MAX_CONNECTIONS",
    "ASYNC_POOL_TIMEOUT",
    "BUSY_POLL_US",
    "CALL_BUDGET",
    "CLIENT_OPTIONS",
    "DECIDE_FIRST_ABOVE",
    "DEFERRAL_CAP",
    "KEY_PREFIX",
    "LATEST_ARGS_MAX",
    "LEASE",
    "MAX_DEFERRALS",
    "ON_REDIS_ERROR",
    "PROVISIONAL_TTL",
    "RATE_WEIGHT",
    "REAP_INTERVAL",
    "REAP_MARGIN",
    "REMEMBER_DUPLICATES",
    "RESTORE_LOOK",
    "RETRIES",
    "RETRY_BACKOFF_BASE",
    "RETRY_BACKOFF_CAP",
    "RUNNING_COUNTDOWN",
    "STARTED_RESTORE_PAUSE",
    "TTL",
]

#: First part of every key (``dedupe_key_prefix``).
KEY_PREFIX: Final = "dedupe"
#: Seconds a queued record lives, plus any countdown (``dedupe_default_ttl``, ``unique_ttl``):
#: how long a lost message keeps its key.
TTL: Final = 3600.0
#: Seconds a run holds its key between heartbeats (``dedupe_default_lease``, ``unique_lease``):
#: how long a killed worker's key outlives it.
LEASE: Final = 60.0
#: Seconds between two looks of a worker that runs ``unique_until="started"`` tasks at the
#: dedup Redis's marker: one that changed says the data was lost (and maybe restored by
#: another process), and the worker's runs take their run locks back at once.
RESTORE_LOOK: Final = 1.0
#: Seconds after a restore that the records of ``unique_until="started"`` messages are
#: written back: a running one's worker takes its run lock back meanwhile (a few looks), and
#: the restore leaves its call key alone (its calls go after it, as before the loss).
STARTED_RESTORE_PAUSE: Final = 3 * RESTORE_LOOK
#: Seconds before a run that met a live run of its key is tried again the first time
#: (``on_running_countdown``); each further deferral of its message waits twice as long.
RUNNING_COUNTDOWN: Final = 0.5
#: The longest wait between two tries of a deferred run (``dedupe_deferral_cap``).
DEFERRAL_CAP: Final = 30.0
#: Deferrals of one message before it gives up (``dedupe_max_deferrals``): its result is
#: stored as revoked, naming the holder. About 48 minutes with the defaults.
MAX_DEFERRALS: Final = 100
#: Seconds between two passes of the workers' reaper (dedupe.runs.reaping): a queued record
#: whose message is gone is freed after two passes that both found no message.
REAP_INTERVAL: Final = 15.0
#: A queued record younger than this is never reaped: its message may be in flight (a queued
#: record's publish has returned; a provisional one lives PROVISIONAL_TTL at most).
REAP_MARGIN: Final = 30.0
#: Seconds a provisional record lives (``dedupe_provisional_ttl``): the record of a call
#: whose message is being published, made durable once the publish returns. Covers a slow
#: publish (kombu's default retry policy gives up within a few seconds); a producer killed
#: mid-publish, or a publish that hangs, leaves its key this long and no longer.
PROVISIONAL_TTL: Final = 20.0
#: The most bytes of serialised arguments a debounced or replacing call may leave in Redis.
LATEST_ARGS_MAX: Final = 64 * 1024
#: On a Redis broker, a task whose recent calls were more than this share duplicates
#: decides before building its message (one round trip more for an accepted call); below
#: it, the call is published in one step and a duplicate pays for a message it throws away.
DECIDE_FIRST_ABOVE: Final = 0.3
#: The weight of the newest call in a task's duplicate share (an exponential average).
RATE_WEIGHT: Final = 1 / 16
#: What a call does when the dedup Redis cannot be reached (``dedupe_on_redis_error``).
ON_REDIS_ERROR: Final = "enqueue"
#: Microseconds to poll for a Redis reply before sleeping for it (``dedupe_busy_poll_us``).
BUSY_POLL_US: Final = 100
#: Seconds a thread answers a repeated duplicate from memory (``dedupe_remember_duplicates``),
#: at most; off (0) by default: Redis tells the thread when the key changes, but a change
#: made elsewhere (a worker's release) can be seen by the caller (its result read) a moment
#: before that word arrives, and the guarantee would cost the round trip memory saves.
REMEMBER_DUPLICATES: Final = 0.0

# Short timeouts and few retries: a producer must not stall for long when the dedup Redis is
# down (redis-py's default retries a failing command ten times). Every script is idempotent
# per task id, so a retried command is safe.
#: Options of the dedup Redis clients, under ``dedupe_redis_options``.
CLIENT_OPTIONS: Final[dict[str, Any]] = {
    "socket_timeout": 2.0,
    "socket_connect_timeout": 1.0,
    "health_check_interval": 30,
}
#: Retries of a failed Redis command, with exponential backoff and jitter (seconds).
RETRIES: Final = 2
#: Seconds one call may wait on the dedup Redis in all, retries included
#: (``dedupe_call_budget``): a frozen server costs a caller this, then the policy decides.
CALL_BUDGET: Final = 3.0
RETRY_BACKOFF_BASE: Final = 0.01
RETRY_BACKOFF_CAP: Final = 0.2
#: The asyncio client's pool: a burst of calls (a web server under load) waits up to
#: ``ASYNC_POOL_TIMEOUT`` seconds for a free connection rather than failing with "Too many
#: connections", which would read as Redis being down. An unreachable Redis still fails each
#: connection fast (``socket_connect_timeout``).
ASYNC_MAX_CONNECTIONS: Final = 64
ASYNC_POOL_TIMEOUT: Final = 30.0
