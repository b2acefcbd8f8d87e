"""A call decided up to its Redis round trips (:class:`DecidedCall`): its kind, its path, its
keys and its records, and the answer to it as a duplicate; what it takes from its task and
options (:class:`CallShape`), and the arguments a debounced or replacing call leaves.

The kinds of call, and the paths, are in the design notes (docs/design-notes.md,
"dedupe.producer.guard").
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Literal

from dedupe.brokers.plans import PushPlan
from dedupe.errors import AlreadyQueued, ArgumentsTooLarge, ConfigurationError, RedisUnavailable
from dedupe.events import DEDUPLICATED, UNAVAILABLE, emit
from dedupe.runs.run import Run
from dedupe.runs.runtime import Runtime, runtime_of
from dedupe.store.store import Store
from dedupe.values import defaults
from dedupe.values.config import SettingReader
from dedupe.values.header import KeyHeader
from dedupe.values.key_derivation import keys_for
from dedupe.values.keys import CallKeys
from dedupe.values.latest import LatestWrite, pack_arguments
from dedupe.values.options import UniqueOptions, options_for, pop_call_options
from dedupe.values.record import Holder, new_nonce, pack_provisional
from dedupe.values.record_state import RecordState
from dedupe.values.timing import delay_seconds, milliseconds, seconds_to_expiry

from .call import Call, CallOptions, in_canvas, new_task_id
from .continuation import Continuation, continuation_of, hand_over_token
from .result import DedupeResult, duplicate_result

__all__ = ["CallShape", "DecidedCall", "latest_arguments"]

# The record of a message sent already expired: the first worker that meets it drops it and
# frees the key; until then, a duplicate is still a duplicate.
_EXPIRED_TTL = 1.0

_enable_utc = SettingReader("enable_utc")


_always_eager = SettingReader("task_always_eager")


#: publish.lua was sent: the message is out with its record, or (its reply lost) may be.
_PUSHED = frozenset({RecordState.SENT, RecordState.QUEUED})


class CallShape:
    """What preparing a call takes from its app, its task and its dedup options, not from its
    arguments: the same for every call of a batch (whose calls share their options).

    A plain class with slots: one is made for every single call, and a frozen dataclass
    costs it a microsecond more."""

    __slots__ = ("budget", "provisional_ttl_ms", "runtime", "task_expires", "unique")

    def __init__(self, call: Call, overrides: Mapping[str, object] | None) -> None:
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


class DecidedCall:
    """A call decided up to its Redis round trips: its kind, path, keys and records (the
    base of :class:`~dedupe.producer.prepared_call.PreparedCall`).

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
        self._continuation: tuple[Continuation, float, float | None] | None = None
        self._token: str | None = None
        #: The run whose key this continuation takes at the run's end, and the handover the
        #: run had before (a retry(throw=False) may have made one already).
        self._handed_at_end: tuple[Run, tuple[float, float | None] | None] | None = None
        self.on_duplicate = unique.on_duplicate
        task_id: Any = options.get("task_id")
        continuation = None
        if task_id is not None:
            if not isinstance(task_id, str):
                # Records compare owners as strings (an int id would be stored as a number).
                task_id = options["task_id"] = str(task_id)
            continuation = continuation_of(call, task_id)
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
        if unique.latest is not None and continuation is None and not in_canvas(options):
            self.latest = LatestWrite(
                latest_arguments(call, unique, options),
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
            self._continuation = (continuation, ttl, now + delay if delay else None)
        else:
            self.kind = "canvas" if in_canvas(options) else "enqueue"
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

    @property
    def writes_first(self) -> bool:
        """The call writes its record before the publish (a provisional one)."""
        return self.kind != "eager" and self.path in ("decide", "confirm")

    def hand_over(self) -> str | None:
        """The run token a continuation speaks for, its run's key handed over to it now (at
        its first write: preparing the call changes nothing). NO_RUN: no run; None outside
        any run (the worker's main process after its child died)."""
        if self._continuation is not None:
            continuation, ttl, eta = self._continuation
            self._continuation = None  # (once: the run's lease is given up here)
            run = continuation.run
            before = run.handover if run is not None else None
            self._token = hand_over_token(self.runtime, continuation, self.keys, ttl, eta)
            if run is not None and run.handover is not before:
                self._handed_at_end = (run, before)
        return self._token

    def take_back_hand_over(self) -> None:
        """The continuation failed before its message went out: its run keeps the key it was
        to hand over at its end, and frees it then (a handover would leave it queued for no
        message). A message that is out, or may be (publish.lua sent), takes it as planned."""
        plan = self._plan
        if plan is not None and (plan.taken or plan.state in _PUSHED):
            return
        if self._handed_at_end is not None:
            run, before = self._handed_at_end
            run.handover = before
            self._handed_at_end = None

    def requeue_arguments(self, token: str) -> tuple[CallKeys, str, str, bytes, int]:
        """The arguments of a continuation's requeue (to a provisional record), speaking for
        the run ``token``."""
        plan = self.plan
        return self.keys, self.task_id, token, plan.provisional, plan.provisional_ttl_ms

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

    def _unavailable(self, exc: RedisUnavailable, action: str) -> None:
        emit(
            UNAVAILABLE,
            self.call.task_name,
            self.task_id,
            self.keys.call,
            action=action,
            error=exc.cause,
        )


def latest_arguments(call: Call, unique: UniqueOptions, options: CallOptions) -> bytes:
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
