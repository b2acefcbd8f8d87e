"""Enqueue-time dedup: decide before publishing whether a call is new or a duplicate.

Every producer entry point (``DedupeTask.apply_async``, ``dedupe.apply_async``, the beat
scheduler) hands a :class:`Call` to :func:`publish_unique`; the asyncio twin in
:mod:`dedupe.producer.aio` drives the same :class:`PreparedCall`. On a Redis broker that is the
dedup store, an accepted call is one round trip that writes its record and pushes its message; a
call that asks first, or any call on another broker, writes a provisional record before the
publish (see :class:`PreparedCall` for the paths). A call refused at the push unsubscribes
the result Celery subscribed to for it.

The kinds of call, and the paths, are in the design notes (docs/design-notes.md,
"dedupe.producer.guard").
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from celery import Celery

from dedupe.errors import AlreadyQueued, ArgumentsTooLarge, ConfigurationError, RedisUnavailable
from dedupe.events import ACCEPTED, DEDUPLICATED, UNAVAILABLE, emit
from dedupe.runs.liveness import lost_run_token
from dedupe.runs.run import NO_RUN, Run, run_of
from dedupe.runs.runtime import Runtime, runtime_of
from dedupe.store.replies import Requeue
from dedupe.store.store import Store
from dedupe.values import defaults
from dedupe.values.config import SettingReader
from dedupe.values.generics import TaskOrName
from dedupe.values.header import HEADER, LATEST, KeyHeader, publishing
from dedupe.values.keys import CallKeys, keys_for
from dedupe.values.latest import LatestWrite, pack_arguments
from dedupe.values.options import UniqueOptions, options_for, pop_call_options
from dedupe.values.record import Holder, new_nonce, pack_provisional
from dedupe.values.timing import delay_seconds, milliseconds, seconds_to_expiry

from .call import Call, Publish, TaskPublish, new_task_id, publisher_for, resolve_task
from .call_sender import sender_for
from .limited_calls import is_limited
from .limits import publish_limited
from .publish_seam import (
    PendingDecision,
    PushPlan,
    Refused,
    deciding_at_push,
    declaring_once,
    pushing_through,
    within_budget,
)
from .publish_signals import end_refused, forget_begun
from .record_state import RecordState
from .result import DedupeResult, duplicate_result, mark_result

__all__ = [
    "Call",
    "CallShape",
    "PreparedCall",
    "Publish",
    "TaskPublish",
    "apply_async",
    "clear",
    "forget_result",
    "lookup",
    "publish_prepared",
    "publish_unique",
    "publisher_for",
]

logger = logging.getLogger("dedupe.producer")

# Options that make a call part of a canvas (chain, group, chord, callbacks).
_CANVAS_OPTIONS = ("chain", "chord", "group_id", "link", "link_error")
# The record of a message sent already expired: the first worker that meets it drops it and
# frees the key; until then, a duplicate is still a duplicate.
_EXPIRED_TTL = 1.0
#: Where a call's own provisional record stands, for a cancel or a confirm to act on.
_CANCELLABLE = frozenset(
    {
        RecordState.PROVISIONAL,
        RecordState.ASKED,
        RecordState.AWAITING_CONFIRM,
        RecordState.UNROUTED,
    }
)
_CONFIRMABLE = frozenset({RecordState.PROVISIONAL, RecordState.AWAITING_CONFIRM})

_always_eager = SettingReader("task_always_eager")
_enable_utc = SettingReader("enable_utc")


class CallShape:
    """What preparing a call takes from its app, its task and its dedup options, not from its
    arguments: the same for every call of a batch (whose calls share their options).

    A plain class with slots: one is made for every single call, and a frozen dataclass
    costs it a microsecond more."""

    __slots__ = ("budget", "provisional_ttl_ms", "runtime", "task_expires", "unique")

    def __init__(self, call: Call, overrides: Mapping[str, Any] | None) -> None:
        runtime = self.runtime = runtime_of(call.app)
        config = runtime.config
        #: The call's dedup options; None under ``task_always_eager`` (nothing to deduplicate).
        self.unique: UniqueOptions | None = (
            None
            if _always_eager(call.app)
            else options_for(call.task, call.task_name, config, overrides)
        )
        if self.unique is not None and self.unique.limited:
            raise ConfigurationError(
                f"task {call.task_name!r}: a task with key_concurrency or key_rate_limit "
                f"accepts every call (each runs in turn); it is never deduplicated: call its "
                f"delay/apply_async (dedupe.apply_async, apply_many, aapply_many and "
                f"aapply_async also publish its calls in turn)"
            )
        #: The task's own ``expires`` (a call's ``expires`` option comes first).
        self.task_expires: Any = getattr(call.task, "expires", None)
        self.provisional_ttl_ms = milliseconds(config.provisional_ttl)
        #: ``dedupe_call_budget``: seconds the call may wait on Redis, the broker's included.
        self.budget = config.call_budget


class PreparedCall:
    """A call decided up to its Redis round trips: its kind, path, keys and records.

    Everything here is CPU work, kept lean: it runs before every producer's round trip,
    duplicates included (no work that only a publish needs, such as the message header).
    The sync and asyncio drivers make the first write, if any, each with its own client;
    :meth:`publish_with_record` (blocking) does the rest for both.

    Its :attr:`path`: ``one-step`` (a Redis broker: publish.lua writes the record and pushes
    the message), ``decide`` (the same, after enqueue.lua decided first), ``overlap`` (any
    other broker: enqueue.lua sent before the message is built, read at the push, then
    confirm.lua) or ``confirm`` (the same, deciding first). A task whose recent calls were
    mostly duplicates decides first (design notes: docs/design-notes.md, "dedupe.producer.guard").
    """

    kind: Literal["eager", "canvas", "continuation", "enqueue"]
    path: Literal["one-step", "decide", "overlap", "confirm"]
    keys: CallKeys
    task_id: str
    #: The run token a continuation speaks for; None when made outside any run.
    token: str | None

    def __init__(
        self, call: Call, *, decide_first: bool = False, shape: CallShape | None = None
    ) -> None:
        """``decide_first``: take the decide or confirm path whatever the task's recent
        calls were (a batch decides all its calls in one round trip first). ``shape``: the
        :attr:`shape` of a call of the same app and task with the same options."""
        self.call = call
        self._decide_first = decide_first
        #: When the call began (``time.monotonic()``): its budget runs from here.
        self.started = time.monotonic()
        app, options = call.app, call.options
        overrides = pop_call_options(options)
        if shape is None:
            shape = CallShape(call, overrides)
        self.shape = shape
        runtime = self.runtime = shape.runtime
        unique = shape.unique
        if unique is None:
            self.kind = "eager"
            return
        config = runtime.config
        self.on_duplicate = unique.on_duplicate
        task_id: Any = options.get("task_id")
        continuation = None
        if task_id is not None:
            if not isinstance(task_id, str):
                # Records compare owners as strings (an int id would be stored as a number).
                task_id = options["task_id"] = str(task_id)
            continuation = _continuation_of(call, task_id)
        if continuation is not None and continuation.header is not None:
            # The same call again (retry, worker lost): keep the keys its message carried.
            header = continuation.header
        else:
            keys = keys_for(
                config.key_prefix, call.task, call.task_name, unique, call.args, call.kwargs
            )
            header = KeyHeader(keys, unique.until, unique.ttl)
        self.header = header
        self.keys = header.keys
        ttl = header.ttl if header.ttl is not None else unique.ttl
        now = time.time()
        #: What a debounced or replacing call leaves for the holder's run if it is a
        #: duplicate: its arguments, serialised (None: any other call).
        self.latest: LatestWrite | None = None
        if unique.latest is not None and continuation is None and not _in_canvas(options):
            self.latest = LatestWrite(
                _latest_arguments(call, unique, options),
                now,
                unique.debounce,
                unique.debounce_max_wait,
            )
        countdown, eta = options.get("countdown"), options.get("eta")
        delay = (
            delay_seconds(countdown, eta, now, enable_utc=_enable_utc(app))
            if countdown or eta
            else 0.0
        )
        if continuation is not None:
            self.kind = "continuation"
            self.token = _token_of(
                runtime, continuation, self.keys, ttl, now + delay if delay else None
            )
        else:
            self.kind = "canvas" if _in_canvas(options) else "enqueue"
            if not task_id:
                task_id = options["task_id"] = new_task_id()
        self.task_id = task_id
        self.path = self._path(runtime)
        self._nonce = new_nonce()
        self._enqueued_at, self._eta = now, (now + delay if delay else None)
        # A message that expires lives until it runs or expires, whatever unique_ttl says:
        # its key lives as long (an expired message met by a worker frees it sooner).
        expires = options.get("expires", shape.task_expires)
        expiry = (
            None
            if expires is None
            else seconds_to_expiry(expires, now, enable_utc=_enable_utc(app))
        )
        if expiry is None or header.until == "window":
            self._ttl = ttl + delay  # (a throttle window lives its ttl, run or not)
        else:
            self._ttl = max(expiry, _EXPIRED_TTL)
        self._plan: PushPlan | None = None
        #: The provisional record the first write sent, if it was packed already.
        self._provisional: bytes | None = None

    @property
    def plan(self) -> PushPlan:
        """What the publish writes with the message (made on first use: a duplicate decided
        before its publish never needs it)."""
        if self._plan is None:
            runtime = self.runtime
            self._plan = PushPlan(
                store_of=lambda: runtime.store,
                keys=self.keys,
                task_id=self.task_id,
                nonce=self._nonce,
                enqueued_at=self._enqueued_at,
                eta=self._eta,
                ttl_ms=milliseconds(self._ttl),
                provisional_ttl_ms=self.shape.provisional_ttl_ms,
                _provisional=self._provisional,
                latest=self.latest,
                # Canvas members and continuations are never refused: a refused member would
                # cut its workflow, a continuation is the same task id going on.
                force=self.kind != "enqueue",
            )
        return self._plan

    def enqueue_arguments(self) -> tuple[CallKeys, bytes, int]:
        """The arguments of the first write of a call that decides first (a provisional
        record: the same bytes the plan packs)."""
        provisional = self._provisional = pack_provisional(self.task_id, self._nonce)
        return self.keys, provisional, self.shape.provisional_ttl_ms

    def _path(self, runtime: Runtime) -> Literal["one-step", "decide", "overlap", "confirm"]:
        one_step = runtime.one_step
        # A continuation requeues first (it acts on a record that may be running).
        decide_first = (
            self._decide_first
            or self.kind == "continuation"
            or runtime.duplicate_share.get(self.call.task_name, 0.0) > defaults.DECIDE_FIRST_ABOVE
        )
        if one_step:
            return "decide" if decide_first else "one-step"
        # A canvas member is never refused: it has nothing to learn at the push. A duplicate
        # of a debounced or replacing call leaves its arguments as it is decided: first.
        latest = self.latest is not None
        return "confirm" if decide_first or latest or self.kind == "canvas" else "overlap"

    @property
    def enqueued_at(self) -> float:
        """When the call was made (the producer's clock), as its record says."""
        return self._enqueued_at

    @property
    def store(self) -> Store:
        return self.runtime.store

    @property
    def deadline(self) -> float | None:
        """The latest a publish may still wait on the broker (None: no call budget)."""
        budget = self.shape.budget
        return self.started + budget if budget else None

    def within_budget(self, producer: Any) -> contextlib.AbstractContextManager[None]:
        """The block of this call's publish through ``producer``: no wait on the broker past
        the call budget (:func:`~dedupe.producer.publish_seam.within_budget`)."""
        return within_budget(
            producer, self.call.app, self.shape.budget, self.deadline, [self.call.options]
        )

    @property
    def writes_first(self) -> bool:
        """The call writes its record before the publish (a provisional one)."""
        return self.kind != "eager" and self.path in ("decide", "confirm")

    def publish(self, through: Publish | None = None) -> DedupeResult:
        """Send the message through Celery, as it is (blocking); ``through``: a publish that
        stands for the call's own (a batch's sender)."""
        call = self.call
        if self.kind != "eager":
            headers = dict(call.options.get("headers") or {})
            headers[HEADER] = self.header.encode()
            if self.latest is not None:
                unique = self.shape.unique
                assert unique is not None
                headers[LATEST] = unique.latest  # (its run takes the latest arguments)
            call.options["headers"] = headers
        with publishing():
            try:
                sent = (through or call.publish)(call.args, call.kwargs, call.options)
            except Refused:
                end_refused(self.task_id)
                raise
            finally:
                forget_begun()
        if self.kind == "eager":
            return mark_result(sent, deduplicated=False)
        # (No store when none could be made: a Cluster no node of which answered.)
        store = self.runtime.existing_store
        return mark_result(sent, deduplicated=False, keys=self.keys, store=store)

    def publish_with_record(self) -> DedupeResult:
        """Publish the message, with its record as the path says (blocking: the asyncio
        driver runs it in a thread). A call refused at the push is a duplicate."""
        try:
            result = self._publish_through_seam()
        except Refused as refused:
            return self.duplicate(refused.holder)
        except BaseException:
            # The message may not exist: free the key so the caller's retry is not refused
            # (never after publish.lua was sent: if it ran, the record has its message).
            self._cancel_after_failure()
            raise
        if self.path in ("overlap", "confirm"):
            self.confirm_record()
        self.note_accepted(self.path)
        return result

    def note_accepted(self, path: str) -> None:
        """Count the call as accepted, and say so (event ``call_accepted``)."""
        self.runtime.count_call(self.call.task_name, duplicate=False)
        emit(ACCEPTED, self.call.task_name, self.task_id, self.keys.call, path=path)

    def _publish_through_seam(self) -> DedupeResult:
        call = self.call
        decision = self._start_deciding() if self.path == "overlap" else None
        refused = None
        given = call.options.get("producer")
        # What Celery's producer_or_acquire does, without its second look at the settings.
        acquired = call.app.producer_pool.acquire(block=True) if given is None else None
        with acquired if acquired is not None else contextlib.nullcontext(given) as producer:
            call.options["producer"] = producer
            try:
                with (
                    self.within_budget(producer),
                    self._seam(producer, decision),
                    declaring_once(producer),
                ):
                    result = self.publish(sender_for(call, producer))
            except Refused as exc:
                # Caught inside the block: kombu (5.5+) replaces the connection of a pooled
                # producer that an exception leaves.
                refused = exc
            except BaseException:
                self._decided(decision, published=False)
                raise
        if refused is not None:
            # Celery subscribed to the result of a task id that will never exist.
            forget_result(call.app, self.task_id)
            raise refused
        if self.path == "overlap":
            # Its record is the decision's (none when the enqueue could not even be sent).
            self._decided(decision)
        elif self.path != "confirm":  # (its record was written first: confirmed after this)
            self.settle_publish()
        return result

    def settle_publish(self, *, went_out: bool = True) -> None:
        """What the record needs after a publish through the Redis-broker seam, for a single
        call and each call of a batch: free the key of a message routed nowhere, confirm the
        provisional record beside a message, write the record of a message that went out
        past the seam (``went_out``: the publish did not raise)."""
        state = self.plan.state
        if state is RecordState.UNROUTED:
            self.cancel_record()
        elif state is RecordState.AWAITING_CONFIRM:
            self.confirm_record()
        elif went_out and state in (RecordState.ABSENT, RecordState.PROVISIONAL):
            self.record_after_the_fact()

    def _start_deciding(self) -> PendingDecision | None:
        plan = self.plan
        try:
            reply = self.store.start_enqueue(self.keys, plan.provisional, plan.provisional_ttl_ms)
        except RedisUnavailable as exc:
            self.first_write_failed(exc)
            return None
        except BaseException:
            # (A script the connection has not run yet, or one idle a while, is sent and read
            # at once: an interruption there leaves its fate unknown.)
            self.withdraw_first_write()
            raise
        return PendingDecision(
            self.store,
            self.keys,
            reply,
            plan.provisional,
            plan.provisional_ttl_ms,
            self.first_write_failed,
        )

    def _seam(self, producer: Any, decision: PendingDecision | None) -> Any:
        if self.path == "one-step" or self.path == "decide":
            return pushing_through(producer, self.plan)
        if decision is not None:
            return deciding_at_push(producer, decision)
        return contextlib.nullcontext()

    def _decided(self, decision: PendingDecision | None, *, published: bool = True) -> None:
        """Settle the overlap path's decision after the publish (or, ``published=False``,
        its failure)."""
        if decision is None:
            return
        decided_at_push = decision.decided
        if decision.decided and not decision.read:
            # Its read was interrupted (the exception this unwinds from): what the enqueue
            # wrote, if anything, is withdrawn by its bytes, never by its task id alone.
            if self.plan.state is RecordState.ABSENT:
                self.plan.move(RecordState.ASKED)
            return
        try:
            holder = decision.decide()
        except RedisUnavailable:
            holder = None  # the policy said raise, but the message may be out: go on
        if holder is None and self.plan.state is RecordState.ABSENT:
            self.plan.move(RecordState.PROVISIONAL)  # (unknown, if the decision failed)
        # A publish that raised before the push read the verdict sent nothing to warn of.
        if holder is not None and not decided_at_push and published:
            self._warn_second_message(holder)

    def cancel_record(self) -> None:
        """Free the key of a call whose message is not out: only its own provisional record
        (nothing written, or unknown: the provisional ttl frees it; never after publish.lua
        was sent)."""
        plan = self.plan
        if plan.state not in _CANCELLABLE:
            return
        # A write whose answer was never read is withdrawn by its very bytes: by its task id
        # alone, it could take an earlier call's record of that id, or a live run's record
        # restored under it.
        exact = plan.state is RecordState.ASKED
        try:
            self.store.cancel(self.keys, self.task_id, exactly=plan.provisional if exact else None)
        except RedisUnavailable as exc:
            self._unavailable(
                exc, "was not published and its key stays (its provisional ttl frees it)"
            )
            return
        plan.move(RecordState.ABSENT)

    def withdraw_first_write(self) -> None:
        """The call was interrupted before it read Redis's answer to its first write (an
        exception raised by a signal handler: a soft time limit, an alarm): withdraw the
        provisional record that write may have made, which would otherwise answer every
        call of the key with a task id that never runs, until the provisional ttl."""
        plan = self.plan
        if plan.state is RecordState.ABSENT:
            plan.move(RecordState.ASKED)
        self._cancel_after_failure()

    def _cancel_after_failure(self) -> None:
        """:meth:`cancel_record` while an exception unwinds the call: that exception is what
        the caller must see, whatever the cancel meets."""
        try:
            self.cancel_record()
        except Exception as exc:
            logger.warning(
                "%s[%s] failed, and its provisional record could not be withdrawn (its "
                "provisional ttl frees it): %r",
                self.call.task_name,
                self.task_id,
                exc,
            )

    def confirm_record(self) -> None:
        """Make the provisional record beside a published message durable (sent without
        waiting for its reply)."""
        plan = self.plan
        if plan.state not in _CONFIRMABLE:
            return
        try:
            self.store.send_confirm(self.keys, plan.provisional, plan.queued, plan.ttl_ms)
        except RedisUnavailable as exc:
            self._unavailable(
                exc,
                "is published but its key is not confirmed (the provisional ttl frees it)",
            )
            return
        plan.move(RecordState.QUEUED)

    def record_after_the_fact(self) -> None:
        """Write the record of a message that went out past the seam."""
        # kombu published on another channel (a retry after a connection error, a producer
        # of another transport): the message is out without its record.
        plan = self.plan
        logger.debug("%s went out through kombu alone; writing its record now", self.task_id)
        try:
            outcome = self.store.publish(
                self.keys,
                plan.queued,
                plan.ttl_ms,
                "",
                (),
                provisional=plan.provisional if plan.state.provisional_written else b"",
            )
        except RedisUnavailable as exc:
            self._unavailable(exc, "is published without its key")
            return
        plan.pushed(outcome)
        if isinstance(outcome, Holder) and self.kind == "enqueue":
            self._warn_second_message(outcome)

    def _warn_second_message(self, holder: Holder) -> None:
        # The message went out on a channel the seam did not see, so it was never refused.
        logger.warning(
            "%s was published while %s held its key (kombu retried the publish on a new "
            "connection): two messages of one call are queued",
            self.task_id,
            holder.task_id,
        )

    def duplicate(self, holder: Holder, *, remembered: bool = False) -> DedupeResult:
        """The answer to a duplicate call: the holder's result, or AlreadyQueued.
        ``remembered``: the holder was this thread's remembered answer (no round trip)."""
        call = self.call
        self.runtime.count_call(call.task_name, duplicate=True)
        emit(
            DEDUPLICATED,
            call.task_name,
            self.task_id,
            self.keys.call,
            holder,
            remembered=remembered,
        )
        if self.on_duplicate == "raise":
            raise AlreadyQueued(call.task_name, holder.task_id, holder.state, holder.key)
        return duplicate_result(
            holder,
            backend=getattr(call.task, "backend", None),
            task_name=call.task_name,
            app=call.app,
            keys=self.keys,
            store=self.store,
        )

    def requeue_arguments(self, token: str) -> tuple[CallKeys, str, str, bytes, int]:
        """The arguments of a continuation's requeue (to a provisional record), speaking for
        the run ``token``."""
        plan = self.plan
        return self.keys, self.task_id, token, plan.provisional, plan.provisional_ttl_ms

    def first_write_done(self, outcome: Holder | Requeue | None) -> DedupeResult | None:
        """Read the first write's answer (enqueue's or requeue's): a duplicate's result, or
        None to go on and publish."""
        if isinstance(outcome, Requeue):
            if outcome is Requeue.QUEUED:
                self.plan.move(RecordState.PROVISIONAL)
            else:
                logger.debug(
                    "the key of %s[%s] stays with its holder (%s)",
                    self.call.task_name,
                    self.task_id,
                    outcome.name.lower().replace("_", " "),
                )
            return None
        if outcome is not None and self.kind == "enqueue":
            return self.duplicate(outcome)
        if outcome is None:
            self.plan.move(RecordState.PROVISIONAL)
        return None

    def first_write_failed(self, exc: RedisUnavailable) -> None:
        """Redis could not be asked: raise, or log and let the caller publish anyway (a
        continuation always goes on). Whatever the write did, if it ran, is provisional: no
        later write of this call is tried (each would wait out the retry policy again, for a
        record the provisional ttl frees anyway)."""
        self.plan.move(RecordState.UNKNOWN)
        if self.kind == "enqueue" and self.runtime.config.on_redis_error == "raise":
            self._unavailable(exc, "is refused (dedupe_on_redis_error='raise')")
            raise exc
        self._unavailable(exc, "is published without dedup")

    def _unavailable(self, exc: RedisUnavailable, action: str) -> None:
        emit(
            UNAVAILABLE,
            self.call.task_name,
            self.task_id,
            self.keys.call,
            action=action,
            error=exc.cause,
        )

    def publish_unrecorded(self) -> DedupeResult:
        """The publish after a first write of unknown fate: plain (what the write left, if
        anything, the provisional ttl frees), within what is left of the call budget."""
        call = self.call
        given = call.options.get("producer")
        acquired = call.app.producer_pool.acquire(block=True) if given is None else None
        with acquired if acquired is not None else contextlib.nullcontext(given) as producer:
            call.options["producer"] = producer
            with self.within_budget(producer):
                return self.publish()


def forget_result(app: Celery, task_id: str) -> None:
    """Undo the result backend's subscription to a task id that was never published."""
    consumer = getattr(app.backend, "result_consumer", None)
    cancel_for = getattr(consumer, "cancel_for", None)
    if callable(cancel_for):
        try:
            cancel_for(task_id)
        except Exception as exc:  # a subscription is no reason to fail a call
            logger.debug("could not unsubscribe from %s: %r", task_id, exc)


def publish_unique(call: Call) -> DedupeResult:
    """Publish a call unless its key is live: the engine behind every producer entry point."""
    return publish_prepared(PreparedCall(call))


def publish_prepared(prepared: PreparedCall) -> DedupeResult:
    """:func:`publish_unique` of a call prepared already."""
    if prepared.kind == "eager":
        return prepared.publish()
    if prepared.kind == "enqueue" and prepared.latest is None:
        # (Nothing is remembered before the store exists: never make it here, unguarded.)
        store = prepared.runtime.existing_store
        holder = store.remembered(prepared.keys) if store is not None else None
        if holder is not None:
            return prepared.duplicate(holder, remembered=True)
    if prepared.writes_first:
        store = prepared.store
        try:
            if prepared.kind == "continuation":
                token = prepared.token
                if token is None:
                    token = lost_run_token(store, prepared.keys)
                outcome: Holder | Requeue | None = store.requeue(*prepared.requeue_arguments(token))
            elif prepared.latest is not None:
                keys, provisional, ttl_ms = prepared.enqueue_arguments()
                outcome = store.enqueue_latest(keys, provisional, ttl_ms, prepared.latest)
            else:
                # A task of mostly duplicates: the duplicate's answer is remembered.
                outcome = store.enqueue(
                    *prepared.enqueue_arguments(), remember=prepared.kind == "enqueue"
                )
        except RedisUnavailable as exc:
            prepared.first_write_failed(exc)
            return prepared.publish_unrecorded()
        except BaseException:
            prepared.withdraw_first_write()
            raise
        duplicate = prepared.first_write_done(outcome)
        if duplicate is not None:
            return duplicate
    return prepared.publish_with_record()


@dataclass(frozen=True, slots=True)
class _Continuation:
    """A call that continues its task id rather than making a new one."""

    #: Made inside the run of that task id (retry, replace), else by the worker's main
    #: process (retry_on_worker_lost).
    in_run: bool
    run: Run | None
    #: The header its message carried, when this call is the same call again.
    header: KeyHeader | None
    #: The task whose run continues (None outside any run).
    task: Any = None


def _continuation_of(call: Call, task_id: str) -> _Continuation | None:
    if not task_id:
        return None
    headers = call.options.get("headers")
    current = call.app.current_worker_task
    if current is not None and current.request.id == task_id:
        request = current.request
        run = run_of(request)
        same_call = (
            current.name == call.task_name
            and list(call.args or ()) == list(request.args or ())
            and dict(call.kwargs or {}) == dict(request.kwargs or {})
        )
        header = None
        if same_call:
            header = (
                KeyHeader(run.spec.keys, run.spec.until, run.spec.ttl)
                if run is not None
                else KeyHeader.read(headers)
            )
        return _Continuation(True, run, header, current)
    header = KeyHeader.read(headers)
    if header is not None:
        # Our own message sent again outside its run: retry_on_worker_lost in the worker's
        # main process, after the child that ran it died.
        return _Continuation(False, None, header)
    return None


def _token_of(
    runtime: Runtime,
    continuation: _Continuation,
    keys: CallKeys,
    ttl: float,
    eta: float | None,
) -> str | None:
    """The run token a continuation speaks for (NO_RUN: none). None outside any run (the
    worker's main process after its child died): the sync driver then asks Redis whether
    the run in the record is dead (liveness.lost_run_token)."""
    if not continuation.in_run:
        return None
    run = continuation.run
    if run is None or run.hand_over_at_end(continuation.task, keys, ttl, eta):
        return NO_RUN  # (the run's end hands its key over: worker.on_postrun)
    return run.hand_over(keys, runtime.heartbeat)


def _latest_arguments(call: Call, unique: UniqueOptions, options: dict[str, Any]) -> bytes:
    """The serialised arguments of a debounced or replacing call (and, debounced, its
    message's countdown: the quiet period); refuses what cannot be done."""
    name = call.task_name
    if not getattr(call.task, "_dedupe_guards_runs", False):
        raise ConfigurationError(
            f"task {name!r}: {_latest_option(unique)} needs a task declared with "
            f"base=dedupe.DedupeTask: its run must take the latest call's arguments"
        )
    if unique.debounce is not None:
        if options.get("countdown") or options.get("eta"):
            raise ConfigurationError(
                f"task {name!r}: debounce decides when the run starts; drop countdown/eta "
                f"from the call (or drop debounce)"
            )
        options["countdown"] = unique.debounce
    serializer = (
        options.get("serializer")
        or getattr(call.task, "serializer", None)
        or call.app.conf.task_serializer
    )
    body = pack_arguments(call.args, call.kwargs, serializer)
    if len(body) > defaults.LATEST_ARGS_MAX:
        raise ArgumentsTooLarge(name, len(body), defaults.LATEST_ARGS_MAX)
    return body


def _latest_option(unique: UniqueOptions) -> str:
    return "debounce" if unique.debounce is not None else 'on_duplicate="replace"'


def _in_canvas(options: Mapping[str, Any]) -> bool:
    # A loop, not any(<generator>): this runs on every call, and the generator costs more.
    for name in _CANVAS_OPTIONS:  # noqa: SIM110
        if options.get(name) is not None:
            return True
    return False


# -- the entry points ------------------------------------------------------------------------


def apply_async(
    task_or_name: TaskOrName,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    app: Celery | None = None,
    **options: Any,
) -> DedupeResult:
    """Publish a call of any task unless the same call is already queued or running.

    The producer guard: works for a task of any base class and for a task name this
    process does not import (the ``send_task`` path). ``options`` are Celery's apply_async
    options plus ``unique_on``, ``unique_key``, ``unique_ttl``, ``unique_until``,
    ``on_duplicate``, ``debounce`` and ``debounce_max_wait``. A call of a task with
    ``key_concurrency`` or ``key_rate_limit`` is published as its ``delay`` publishes it
    (every call accepted, each in turn).

    .. code-block:: python

        result = dedupe.apply_async(refresh_report, args=(42,))
        result.deduplicated                                            # False
        dedupe.apply_async("reports.refresh", args=(42,), app=app).deduplicated   # True
    """
    call = Call.of(task_or_name, args, kwargs, options, app)
    if is_limited(call):
        return publish_limited(call)  # (every call accepted, as its delay publishes it)
    return publish_unique(call)


def keys_of_call(
    task_or_name: TaskOrName,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    app: Celery | None,
    overrides: Mapping[str, Any],
) -> tuple[Runtime, CallKeys]:
    """The runtime of a call's app and the call's keys (for lookups and releases)."""
    task, name, app = resolve_task(task_or_name, app)
    runtime = runtime_of(app)
    options = options_for(task, name, runtime.config, overrides)
    return runtime, keys_for(runtime.config.key_prefix, task, name, options, args, kwargs)


def lookup(
    task_or_name: TaskOrName,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    app: Celery | None = None,
    **overrides: Any,
) -> Holder | None:
    """The task holding the key of a call (``.task_id``, ``.state``, ``.ttl``), or None.

    .. code-block:: python

        holder = dedupe.lookup(refresh_report, args=(42,))
        holder.state if holder else "free"                             # 'queued'
    """
    runtime, keys = keys_of_call(task_or_name, args, kwargs, app, overrides)
    return runtime.store.lookup(keys)


def clear(
    task_or_name: TaskOrName,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    app: Celery | None = None,
    **overrides: Any,
) -> bool:
    """Force-clear the key of a call, whoever holds it. True if a key was deleted.

    A run still holding the key keeps running; its heartbeat re-creates the key.

    .. code-block:: python

        dedupe.clear(refresh_report, args=(42,))                       # True
    """
    runtime, keys = keys_of_call(task_or_name, args, kwargs, app, overrides)
    return runtime.store.clear(keys)
