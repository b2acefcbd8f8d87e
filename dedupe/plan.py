"""One call, decided up to its Redis round trip: its options, key, record and message.

Everything here is CPU work: the sync and asyncio entry points (producer.py, aio.py) drive
the same :class:`Plan`, each with its own Redis client.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from celery import Celery
from celery.result import AsyncResult

from .celery_conf import SettingReader
from .config import DedupeConfig
from .errors import AlreadyQueued, RedisUnavailable
from .keys import CallKeys, binder_for, call_digest, call_keys
from .options import UniqueOptions, pop_call_options, resolve
from .record import Holder, pack_queued
from .result import duplicate_result, mark_result
from .run import HEADER, NO_RUN, Carried, Run, carried_by, publishing, run_of
from .runtime import Runtime, runtime_of
from .store import Store

__all__ = ["Plan", "Publish", "keys_for", "new_task_id", "options_for"]

logger = logging.getLogger("dedupe.producer")

#: Publishes a call: ``publish(args, kwargs, options)`` with Celery's apply_async options.
Publish = Callable[
    [Sequence[Any] | None, Mapping[str, Any] | None, dict[str, Any]], AsyncResult[Any]
]

# Options that make a call part of a canvas (chain, group, chord, callbacks). Such calls are
# never refused at enqueue time: a refused member would hang or cut its workflow. The
# execution guard still keeps their runs apart, and it never skips them (it defers them).
_CANVAS_OPTIONS = ("chain", "chord", "group_id", "link", "link_error")

_always_eager = SettingReader("task_always_eager")

# Task-level options change only when the code does: resolved once per task and kept on the
# task object (as the binder is), checked against the app's settings they were made with.
_OPTIONS = "_dedupe_options"


def options_for(
    task: Any, task_name: str, config: DedupeConfig, overrides: Mapping[str, Any] | None = None
) -> UniqueOptions:
    """The dedup options of a call of ``task`` (None: a task not registered here)."""
    if overrides or task is None:
        return resolve(task, task_name, config, overrides)
    cached = getattr(task, _OPTIONS, None)
    if type(cached) is tuple and cached[0] is config:
        options: UniqueOptions = cached[1]
        return options
    options = resolve(task, task_name, config)
    setattr(task, _OPTIONS, (config, options))
    return options


def keys_for(
    runtime: Runtime,
    task: Any,
    task_name: str,
    options: UniqueOptions,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
) -> CallKeys:
    """Derive the keys of a call."""
    binder = binder_for(task) if task is not None else None
    digest = call_digest(
        task_name, binder, args, kwargs, unique_on=options.on, unique_key=options.key
    )
    return call_keys(
        runtime.config.key_prefix,
        task_name,
        digest,
        separate_run_lock=options.until == "started",
    )


class Plan:
    """One call, decided up to its Redis round trip: the key, the record, the message.

    ``kind`` says what the call needs: ``"eager"`` and ``"canvas"`` only a publish,
    ``"continuation"`` a requeue then a publish, ``"enqueue"`` the enqueue round trip
    whose answer decides between :meth:`publish` and :meth:`duplicate`. The sync and
    asyncio entry points drive the same plan, each with its own Redis client.
    """

    kind: Literal["eager", "canvas", "continuation", "enqueue"]
    keys: CallKeys
    task_id: str
    #: The run token a continuation speaks for; None when made outside any run.
    token: str | None
    record: bytes
    ttl_ms: int

    def __init__(
        self,
        app: Celery,
        task: Any,
        task_name: str,
        args: Sequence[Any] | None,
        kwargs: Mapping[str, Any] | None,
        options: dict[str, Any],
        publisher: Publish,
    ) -> None:
        # Runs before every producer's round trip, duplicates included: kept lean (no work
        # that only a publish needs, such as the message header, is done here).
        self.app, self.task, self.task_name = app, task, task_name
        self.args, self.kwargs, self.options = args, kwargs, options
        self._publisher = publisher
        runtime = self.runtime = runtime_of(app)
        overrides = pop_call_options(options)
        if _always_eager(app):
            # Runs inline and returns at once: there is nothing to deduplicate against.
            self.kind = "eager"
            return
        unique = options_for(task, task_name, runtime.config, overrides)
        self.on_duplicate = unique.on_duplicate
        task_id: Any = options.get("task_id")
        continuation = None
        if task_id is not None:
            if not isinstance(task_id, str):
                # Records compare owners as strings (an int id would be stored as a number).
                task_id = options["task_id"] = str(task_id)
            continuation = _continuation_of(
                app, task_id, task_name, args, kwargs, options.get("headers")
            )
        if continuation is not None and continuation.carried is not None:
            # The same call again (retry, worker lost): keep the key its message carried,
            # never recompute it (call-level options and the send_task path would change it).
            call = continuation.carried
        else:
            keys = keys_for(runtime, task, task_name, unique, args, kwargs)
            call = Carried(keys, unique.until, unique.ttl)
        self.call = call
        self.keys = call.keys
        ttl = call.ttl if call.ttl is not None else unique.ttl
        now = time.time()
        delay = _delay_of(options, now, app)
        if continuation is not None:
            # A continuation of a task id (retry, replace, worker lost): never a duplicate.
            self.kind = "continuation"
            self.token = _token_of(runtime, continuation, self.keys)
        elif _in_canvas(options):
            self.kind = "canvas"
            return
        else:
            self.kind = "enqueue"
            if not task_id:
                task_id = options["task_id"] = new_task_id()
        self.task_id = task_id
        self.record = pack_queued(task_id, now, now + delay if delay else None)
        self.ttl_ms = _ms(ttl + delay)

    @property
    def store(self) -> Store:
        return self.runtime.store

    def publish(self) -> AsyncResult[Any]:
        """Send the message (blocking: the asyncio entry points run it in a thread)."""
        if self.kind != "eager":
            # The worker reads the call's key from the message: never recomputes it.
            options = self.options
            headers = dict(options.get("headers") or {})
            headers[HEADER] = self.call.header()
            options["headers"] = headers
        with publishing():
            sent = self._publisher(self.args, self.kwargs, self.options)
        if self.kind == "eager":
            return mark_result(sent, deduplicated=False)
        return mark_result(sent, deduplicated=False, keys=self.keys, store=self.store)

    def duplicate(self, holder: Holder) -> AsyncResult[Any]:
        """The answer to a duplicate call: the holder's result, or AlreadyQueued."""
        logger.debug("duplicate of %s[%s] (%s)", self.task_name, holder.task_id, holder.state)
        if self.on_duplicate == "raise":
            raise AlreadyQueued(self.task_name, holder.task_id, holder.state, holder.key)
        return duplicate_result(
            holder,
            backend=getattr(self.task, "backend", None),
            task_name=self.task_name,
            app=self.app,
            keys=self.keys,
            store=self.store,
        )

    def enqueue_failed(self, exc: RedisUnavailable) -> None:
        """Redis could not be asked: raise, or log and let the caller publish anyway."""
        if self.runtime.config.on_redis_error == "raise":
            raise exc
        logger.warning(
            "dedup Redis unavailable, publishing %s[%s] without dedup: %s",
            self.task_name,
            self.task_id,
            exc.cause,
        )

    def requeue_failed(self, exc: RedisUnavailable) -> None:
        logger.warning("could not requeue the key of %s: %s", self.task_id, exc.cause)

    def cancel_failed(self, exc: RedisUnavailable) -> None:
        logger.warning(
            "publish of %s failed and its key could not be freed (its ttl will): %s",
            self.task_id,
            exc.cause,
        )


@dataclass(frozen=True)
class _Continuation:
    """A call that continues ``task_id`` rather than making a new one."""

    #: Made inside the run of that task id (retry, replace), else by the worker's main
    #: process (retry_on_worker_lost).
    in_run: bool
    run: Run | None
    #: The call its message carried, when this call is the same call again.
    carried: Carried | None


def _continuation_of(
    app: Celery,
    task_id: str,
    task_name: str,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    headers: Mapping[str, Any] | None,
) -> _Continuation | None:
    if not task_id:
        return None
    current = app.current_worker_task
    if current is not None and current.request.id == task_id:
        request = current.request
        run = run_of(request)
        same_call = (
            current.name == task_name
            and list(args or ()) == list(request.args or ())
            and dict(kwargs or {}) == dict(request.kwargs or {})
        )
        carried = None
        if same_call:
            carried = (
                Carried(run.spec.keys, run.spec.until, run.spec.ttl)
                if run is not None
                else carried_by(headers)
            )
        return _Continuation(True, run, carried)
    carried = carried_by(headers)
    if carried is not None:
        # Our own message sent again outside its run: retry_on_worker_lost in the worker's
        # main process, after the child that ran it died.
        return _Continuation(False, None, carried)
    return None


def _token_of(runtime: Runtime, continuation: _Continuation, keys: CallKeys) -> str | None:
    """The run token a continuation speaks for (NO_RUN: none). None outside any run (the
    worker's main process after its child died): the driver asks Redis whether the run
    in the record is dead (main_process_token)."""
    if not continuation.in_run:
        return None
    run = continuation.run
    if run is None or run.verdict == "held":
        # Nothing to put back (a deferral of a run that never claimed must not touch the
        # holder's record).
        return NO_RUN
    if run.spec.keys != keys:
        # Moving on to another key (new arguments, another task): the run's own key is
        # released when the run ends.
        return NO_RUN
    if run.lease is not None:
        # Stop renewing before the record goes back to queued: a late renewal would find
        # it queued and give up the lease, or re-create a running record.
        runtime.heartbeat.drop(run.lease)
        run.lease = None
    run.requeued = True
    return run.token if run.verdict == "claimed" else ""


def _in_canvas(options: Mapping[str, Any]) -> bool:
    # A loop, not any(<generator>): this runs on every call, and the generator costs more.
    for name in _CANVAS_OPTIONS:  # noqa: SIM110
        if options.get(name) is not None:
            return True
    return False


def new_task_id() -> str:
    """A new task id: a random UUID (version 4) in its usual text form, as Celery makes them.

    Formatted here from 16 random bytes: uuid.uuid4() builds a UUID object first, which
    costs a producer call more than the rest of its key and record together.
    """
    digits = os.urandom(16).hex()
    variant = "89ab"[int(digits[16], 16) & 3]
    return f"{digits[:8]}-{digits[8:12]}-4{digits[13:16]}-{variant}{digits[17:20]}-{digits[20:]}"


def _delay_of(options: Mapping[str, Any], now: float, app: Celery) -> float:
    """Seconds until the call may run (countdown or eta): the record must outlive them."""
    countdown = options.get("countdown")
    if countdown:
        return max(float(countdown), 0.0)
    eta = options.get("eta")
    if not eta:
        return 0.0
    if isinstance(eta, str):
        eta = dt.datetime.fromisoformat(eta)
    if isinstance(eta, dt.datetime):
        if eta.tzinfo is None:
            eta = eta.replace(tzinfo=dt.timezone.utc) if app.conf.enable_utc else eta.astimezone()
        return max(eta.timestamp() - now, 0.0)
    return 0.0


def _ms(seconds: float) -> int:
    return max(int(seconds * 1000), 1)
