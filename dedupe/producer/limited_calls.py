"""Calls of a limited task (``key_concurrency``, ``key_rate_limit``) made through the entry
points that deduplicate other tasks' calls (``dedupe.apply_many``, ``aapply_many``,
``aapply_async``): each is published as its ``delay`` publishes it
(:func:`~dedupe.producer.limits.publish_limited`), its place in line taken or its start
reserved, then its message sent. Nothing is deduplicated: every call is accepted.

A batch's calls go one after the other, in call order (the order of their places, or of
their starts): each takes its place in its own round trip, as a ``delay`` does. Not
pipelined: publish_limited prepares, reserves and publishes in one function, and a batch
that reserved first would need a copy of its preparation (keys, header, the place's ttl).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from dedupe.runs.runtime import runtime_of
from dedupe.values.config import SettingReader
from dedupe.values.options import options_for

from .call import Call
from .limits import publish_limited
from .result import DedupeResult

__all__ = ["apublish_limited", "is_limited", "publish_limited_many"]

_always_eager = SettingReader("task_always_eager")

# Calls in flight: asyncio keeps only weak references to tasks.
_in_flight: set[asyncio.Future[DedupeResult]] = set()


def is_limited(call: Call) -> bool:
    """Is ``call`` of a task with ``key_concurrency`` or ``key_rate_limit``? (A task's
    declaration says so: no call option makes a call limited.)"""
    if call.task is None or _always_eager(call.app):
        # (A name this process does not import has no declaration to say so; eager:
        # nothing to limit, nor to deduplicate: the guard runs it.)
        return False
    return options_for(call.task, call.task_name, runtime_of(call.app).config).limited


def publish_limited_many(calls: Sequence[Call]) -> list[DedupeResult]:
    """Publish each call of a limited task, in call order. A call whose publish raises
    leaves its place (as its ``delay`` would) and the error is raised: the calls after it
    are not made."""
    return [publish_limited(call) for call in calls]


async def apublish_limited(call: Call) -> DedupeResult:
    """:func:`~dedupe.producer.limits.publish_limited`, awaitable: in the loop's default
    executor (its round trip and kombu block), shielded from the caller's cancellation
    (cancelled between its place and its publish, a call would hold its key's line until
    its place lapses)."""
    published = asyncio.ensure_future(asyncio.to_thread(publish_limited, call))
    _in_flight.add(published)
    published.add_done_callback(_in_flight.discard)
    return await asyncio.shield(published)
