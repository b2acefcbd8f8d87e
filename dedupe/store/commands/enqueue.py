"""The store's enqueues: a producer asks for a call's key before publishing its message, one
call or a batch at a time, and answers a repeated duplicate from memory."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from redis.commands.core import Script

from dedupe.store.connections import Reply
from dedupe.store.redis_errors import reraise_unavailable
from dedupe.store.replies import not_decided, read_enqueue
from dedupe.store.resp import ScriptCall
from dedupe.values.keys import CallKeys
from dedupe.values.latest import LatestWrite
from dedupe.values.record import Holder

from .base import StoreBase, raise_first_error
from .batches import (
    ENQUEUE_CHUNK,
    EnqueueCall,
    LatestCall,
    chunk_replies,
    enqueue_call,
    enqueue_latest_call,
    enqueue_latest_many_call,
    enqueue_many_call,
)

__all__ = ["EnqueueCommands"]

_Call = TypeVar("_Call", EnqueueCall, LatestCall)


class EnqueueCommands(StoreBase):
    """Creating a call's queued record (enqueue.lua, enqueue_latest.lua and their batches)."""

    _enqueue: Script
    _enqueue_many: Script
    _enqueue_latest: Script
    _enqueue_latest_many: Script

    def enqueue(
        self, keys: CallKeys, record: bytes, ttl_ms: int, *, remember: bool = False
    ) -> Holder | None:
        """Create the queued record of a call. None: accepted; a Holder: a duplicate of it.
        ``remember``: a duplicate's holder becomes this thread's answer for the key until
        Redis says the key changed (:meth:`remembered`), from the key's second duplicate
        within ``remember_duplicates`` on (Redis tracks only keys met held before)."""
        barrier = self._barrier()
        marked = [keys.call, barrier.marker] if barrier else [keys.call]
        run = self._run
        with reraise_unavailable("enqueue", keys.call):
            if remember and run.worth_tracking(keys.call):
                reply, tracked_at = run.call_tracked(self._enqueue, marked, [record, ttl_ms])
                if tracked_at is not None and isinstance(reply, bytes):
                    return self._remember(keys.call, reply, tracked_at)
            else:
                reply = run(self._enqueue, marked, [record, ttl_ms])
                if remember and isinstance(reply, bytes):
                    run.note_duplicate(keys.call)  # the next duplicate is tracked
        if not_decided(reply):
            self._restore_lost(barrier)
            with reraise_unavailable("enqueue", keys.call):
                reply = self._run(self._enqueue, [keys.call], [record, ttl_ms])
        return read_enqueue(keys.call, reply)

    def enqueue_latest(
        self, keys: CallKeys, record: bytes, ttl_ms: int, latest: LatestWrite
    ) -> Holder | None:
        """:meth:`enqueue` for a debounced or replacing call: a duplicate of a holder that
        has not started leaves ``latest`` (its arguments and, debounced, the burst's new
        deadline) for its run. One round trip; never remembered (each duplicate has
        arguments to leave)."""
        barrier = self._barrier()
        marked = [keys.call, keys.latest]
        if barrier:
            marked.append(barrier.marker)
        argv = [record, ttl_ms, *latest.argv()]
        with reraise_unavailable("enqueue", keys.call):
            reply = self._run(self._enqueue_latest, marked, argv)
        if not_decided(reply):
            self._restore_lost(barrier)
            with reraise_unavailable("enqueue", keys.call):
                reply = self._run(self._enqueue_latest, marked[:2], argv)
        return read_enqueue(keys.call, reply)

    def _remember(self, key: str, reply: bytes, tracked_at: float) -> Holder:
        holder = read_enqueue(key, reply)
        assert holder is not None
        if holder.ttl is not None and not holder.provisional:
            # (A provisional holder is a publish in flight: its answer changes in a moment.)
            expires_at = tracked_at + holder.ttl
            self._run.remember(key, expires_at, (expires_at, holder))
        return holder

    def remembered(self, keys: CallKeys) -> Holder | None:
        """The holder of a call's key as this thread last heard it from an enqueue made with
        ``remember``, if Redis has said nothing of the key since (no round trip); else None."""
        entry = self._run.remembered(keys.call)
        if entry is None:
            return None
        expires_at, holder = entry
        remembered: Holder = dataclasses.replace(
            holder, ttl=max(expires_at - time.monotonic(), 0.0)
        )
        return remembered

    def enqueue_many(self, calls: Sequence[EnqueueCall]) -> list[Holder | None]:
        """:meth:`enqueue` for many calls in one round trip; the answers in order. On one
        server, ``enqueue_many.lua`` decides up to ``ENQUEUE_CHUNK`` calls per script (half
        the cost of a script per call); on a Cluster each call goes to its own slot's master."""
        return self._enqueue_all(
            calls, self._enqueue, self._enqueue_many, enqueue_call, enqueue_many_call
        )

    def enqueue_latest_many(self, calls: Sequence[LatestCall]) -> list[Holder | None]:
        """:meth:`enqueue_latest` for many calls in one round trip, decided in order (a
        later call of a key leaves its arguments for the earlier call's run); the answers in
        order. Chunked as :meth:`enqueue_many` (``enqueue_latest_many.lua``)."""
        return self._enqueue_all(
            calls,
            self._enqueue_latest,
            self._enqueue_latest_many,
            enqueue_latest_call,
            enqueue_latest_many_call,
        )

    def _enqueue_all(
        self,
        calls: Sequence[_Call],
        single: Script,
        many: Script,
        one: Callable[[_Call], ScriptCall],
        chunk_of: Callable[[Sequence[_Call], str | None], ScriptCall],
    ) -> list[Holder | None]:
        key = calls[0][0].call if calls else None
        with reraise_unavailable("enqueue", key):
            if self._run.spans_calls:
                replies = self._enqueue_chunks(calls, many, chunk_of)
            else:
                replies = self._run.call_many(single, [one(call) for call in calls])
            raise_first_error(replies)
        return [
            read_enqueue(call[0].call, reply) for call, reply in zip(calls, replies, strict=True)
        ]

    def _enqueue_chunks(
        self,
        calls: Sequence[_Call],
        many: Script,
        chunk_of: Callable[[Sequence[_Call], str | None], ScriptCall],
    ) -> list[object]:
        # One server: a script per chunk, all in one round trip; the chunks sent while the
        # store's data was lost and not restored go again after the restore.
        chunks = [
            calls[start : start + ENQUEUE_CHUNK] for start in range(0, len(calls), ENQUEUE_CHUNK)
        ]
        barrier = self._barrier()
        marker = barrier.marker if barrier else None
        answers = self._run.call_many(many, [chunk_of(chunk, marker) for chunk in chunks])
        lost = [index for index, answer in enumerate(answers) if not_decided(answer)]
        if lost:
            self._restore_lost(barrier)
            again = self._run.call_many(many, [chunk_of(chunks[index], None) for index in lost])
            for index, answer in zip(lost, again, strict=True):
                answers[index] = answer
        return [
            reply
            for chunk, answer in zip(chunks, answers, strict=True)
            for reply in chunk_replies(answer, len(chunk))
        ]

    def start_enqueue(self, keys: CallKeys, record: bytes, ttl_ms: int) -> Reply:
        """:meth:`enqueue`, sent now and read later (:meth:`enqueue_result`, same thread):
        the caller does its other work while Redis decides."""
        barrier = self._barrier()
        marked = [keys.call, barrier.marker] if barrier else [keys.call]
        with reraise_unavailable("enqueue", keys.call):
            slot = self._run.send(self._enqueue, marked, [record, ttl_ms], reply=True)
        assert slot is not None
        return slot

    def enqueue_result(
        self, keys: CallKeys, slot: Reply, record: bytes, ttl_ms: int
    ) -> Holder | None:
        """The answer to :meth:`start_enqueue` (of ``record`` and ``ttl_ms``): None
        accepted, else the holder."""
        with reraise_unavailable("enqueue", keys.call):
            reply = self._run.result(slot)
        if not_decided(reply):
            self._restore_lost(self.barrier)
            with reraise_unavailable("enqueue", keys.call):
                reply = self._run(self._enqueue, [keys.call], [record, ttl_ms])
        return read_enqueue(keys.call, reply)
