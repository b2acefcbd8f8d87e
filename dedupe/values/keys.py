"""A call's dedup keys, named: what each key is called and how a name is read back (the
digest that names a call comes from :mod:`dedupe.values.key_derivation`).

Key format, versioned by :data:`KEY_VERSION` (a change of any rule here must bump it)::

    <prefix>:{<task name>:<32 hex digits>}        the record of a call
    <prefix>:{<task name>:<32 hex digits>}:run    the run lock (unique_until "started", "window")

:func:`format_call_key` spells it and :func:`parse_call_key` reads it back, its exact inverse.
The braces are a Redis Cluster hash tag: every key of one call lands in one slot, so one
Lua script may touch them all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from .limits import LIMIT_KEY_NAMES

__all__ = [
    "FLOW_SUFFIXES",
    "KEY_VERSION",
    "LATEST_SUFFIX",
    "RAN_SUFFIX",
    "RUN_SUFFIX",
    "CallKeyParts",
    "CallKeys",
    "alive_key",
    "call_keys",
    "format_call_key",
    "holds_keys",
    "limited_names_key",
    "nodes_key",
    "parse_call_key",
    "reaper_keys",
    "tag_safe",
    "task_name_of_tag",
    "tick_key",
    "view_keys",
    "view_task_keys",
    "watch_keys",
]

#: Personalises BLAKE2b, so that digests of a future key format never equal today's.
KEY_VERSION = b"dedupe-key-v1"


#: Ends the name of a call's separate run lock (``unique_until="started"``).
RUN_SUFFIX = ":run"
#: The suffix of a call key's latest-arguments hash (:attr:`CallKeys.latest`).
LATEST_SUFFIX = ":latest"
#: The suffix of a call key's ended runs (:attr:`CallKeys.ran`).
RAN_SUFFIX = ":ran"
#: The suffixes of flow control's keys beside a record: a debounced or replacing call's
#: latest arguments and ended runs, a limited key's keys (:func:`dedupe.values.limits.limit_keys`).
FLOW_SUFFIXES = (LATEST_SUFFIX, RAN_SUFFIX, *(f":{name}" for name in LIMIT_KEY_NAMES))
#: The length of a call's digest (:func:`call_digest`), in hex digits.
_DIGEST_LENGTH = 32


@dataclass(frozen=True, slots=True)
class CallKeys:
    """The Redis keys of one call.

    ``call`` holds the call's record while it is queued (and, with ``unique_until="finished"``,
    while it runs); ``run`` is the key a run holds: the same key, or with
    ``unique_until="started"`` a separate run lock.

    >>> CallKeys.of("dedupe:{t:ab}", separate_run_lock=True)
    CallKeys(call='dedupe:{t:ab}', run='dedupe:{t:ab}:run')
    """

    call: str
    run: str

    @classmethod
    def of(cls, call: str, *, separate_run_lock: bool) -> CallKeys:
        """The keys of a call, from its call key."""
        return cls(call, call + RUN_SUFFIX if separate_run_lock else call)

    @property
    def latest(self) -> str:
        """The hash of the latest arguments left by the duplicates of a debounced or
        replacing call, one field per task id (same hash tag as the call key)."""
        return self.call + LATEST_SUFFIX

    @property
    def ran(self) -> str:
        """The runs of a debounced or replacing call that ended, each a task id and its
        retry count (no arguments), kept while the broker may deliver their messages again
        (same hash tag as the call key)."""
        return self.call + RAN_SUFFIX

    @property
    def names(self) -> list[str]:
        """The distinct key names: the call key first."""
        return [self.call] if self.run == self.call else [self.call, self.run]


def call_keys(prefix: str, task_name: str, digest: str, *, separate_run_lock: bool) -> CallKeys:
    """Name the keys of a call from its digest."""
    return CallKeys.of(
        format_call_key(prefix, task_name, digest), separate_run_lock=separate_run_lock
    )


def format_call_key(prefix: str, task_name: str, digest: str) -> str:
    """The key of a call's record; :func:`parse_call_key` reads it back.

    >>> format_call_key("dedupe", "reports:eu", "ab")
    'dedupe:{reports:eu:ab}'
    """
    return f"{prefix}:{{{tag_safe(task_name)}:{digest}}}"


class CallKeyParts(NamedTuple):
    """What a call key or run lock of a prefix is made of."""

    task_name: str
    digest: str
    #: The key is a call's separate run lock (:data:`RUN_SUFFIX`), not its record.
    run_lock: bool


def parse_call_key(prefix: str, key: str) -> CallKeyParts | None:
    """The parts of a call key or run lock of ``prefix`` (:func:`format_call_key`), or None
    for any other key: another prefix's or program's, or one of flow control's.

    >>> parse_call_key("dedupe", "dedupe:{reports:eu:0123456789abcdef0123456789abcdef}:run")
    CallKeyParts(task_name='reports:eu', digest='0123456789abcdef0123456789abcdef', run_lock=True)
    """
    head = f"{prefix}:{{"
    if not key.startswith(head):
        return None
    body = key[len(head) :]
    run_lock = body.endswith(RUN_SUFFIX)
    if run_lock:
        body = body[: -len(RUN_SUFFIX)]
    if not body.endswith("}"):
        return None
    name, colon, digest = body[:-1].rpartition(":")
    if not colon or len(digest) != _DIGEST_LENGTH:
        return None
    return CallKeyParts(task_name_of_tag(name), digest, run_lock)


def alive_key(prefix: str) -> str:
    """The marker key whose absence tells a worker that the dedup Redis lost its data.

    >>> alive_key("dedupe")
    'dedupe:alive'
    """
    return f"{prefix}:alive"


def watch_keys(prefix: str, watcher: str) -> tuple[str, str]:
    """The keys of one worker's watch on the dedup Redis (:mod:`dedupe.recovery.held`): a list
    nobody writes, which it blocks on (a restart ends the wait at once), and its own marker, whose
    absence tells it the data was lost where the server does not say which run it is.

    >>> watch_keys("dedupe", "vm:41")
    ('dedupe:watch', 'dedupe:alive:vm:41')
    """
    return f"{prefix}:watch", f"{prefix}:alive:{watcher}"


def reaper_keys(prefix: str) -> tuple[str, str]:
    """The keys of the reaper (:mod:`dedupe.runs.reaping`): the lock of the one worker that
    sweeps, and the hash of the records its last pass found without a message (call key ->
    when first found), which ``celery dedupe list`` and the web view mark.

    >>> reaper_keys("dedupe")
    ('dedupe:reaper', 'dedupe:reaper:suspects')
    """
    return f"{prefix}:reaper", f"{prefix}:reaper:suspects"


def holds_keys(prefix: str, node: str) -> tuple[str, str]:
    """The keys of what the workers hold (received, not yet acked), as they last told the
    reaper, on a broker whose unacked messages nobody else can read: the set of the holds
    keys that were written, and ``node``'s, the set of the task ids it holds.

    >>> holds_keys("dedupe", "celery@vm")
    ('dedupe:holds', 'dedupe:holds:celery@vm')
    """
    return f"{prefix}:holds", f"{prefix}:holds:{node}"


def nodes_key(prefix: str) -> str:
    """The hash of the live workers' processes: ``host:pid`` (as running records name them)
    -> the worker's Celery node name, for the web view.

    >>> nodes_key("dedupe")
    'dedupe:nodes'
    """
    return f"{prefix}:nodes"


def limited_names_key(prefix: str) -> str:
    """The set of the task names the workers know as limited (``key_concurrency``,
    ``key_rate_limit``): a call by name from a process that does not import the task is
    published as its ``delay`` would publish it.

    >>> limited_names_key("dedupe")
    'dedupe:limited'
    """
    return f"{prefix}:limited"


def tick_key(prefix: str, entry_name: str, tick: int) -> str:
    """The key of one tick of a beat entry: the beat that creates it sends that tick.

    >>> tick_key("dedupe", "nightly-report", 20431)
    'dedupe:beat:{nightly-report}:20431'
    """
    return f"{prefix}:beat:{{{tag_safe(entry_name)}}}:{tick}"


def view_keys(prefix: str) -> tuple[str, str]:
    """The web view's switch (present while a ``celery dedupe web`` server runs: producers and
    workers then log their events) and its set of task names with events. Outside
    ``prefix:``, so that listing the records (SCAN ``prefix:*``) never meets them.

    >>> view_keys("dedupe")
    ('dedupe/view:on', 'dedupe/view:tasks')
    """
    return f"{prefix}/view:on", f"{prefix}/view:tasks"


def view_task_keys(prefix: str, task_name: str, minute: int) -> tuple[str, str]:
    """One task's event stream for the web view and its counts of one minute (one hash
    tag: one round trip writes both, also on a Redis Cluster).

    >>> view_task_keys("dedupe", "reports", 29000000)
    ('dedupe/view:{reports}:events', 'dedupe/view:{reports}:minute:29000000')
    """
    head = f"{prefix}/view:{{{tag_safe(task_name)}}}"
    return f"{head}:events", f"{head}:minute:{minute}"


def tag_safe(task_name: str) -> str:
    """A task name as keys spell it: ``}`` (which would end the Redis Cluster hash tag early,
    or leave it empty, and part a call's keys across slots) and ``%`` percent-escaped.

    >>> tag_safe("reports}eu")
    'reports%7Deu'
    """
    if "}" not in task_name and "%" not in task_name:
        return task_name
    return task_name.replace("%", "%25").replace("}", "%7D")


def task_name_of_tag(text: str) -> str:
    """The task name :func:`tag_safe` spelled as ``text``."""
    if "%" not in text:
        return text
    return _ESCAPE.sub(lambda match: "%" if match.group(1) == "25" else "}", text)


_ESCAPE = re.compile(r"%(25|7D)")
