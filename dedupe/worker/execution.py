"""Worker side, in the process that runs the task: claim the key when a run starts, guard
it, release it when the run ends.

Each way a run ends is seen where Celery reports it (``after_return`` misses most of them;
the list is in the design notes: docs/design-notes.md, "dedupe.worker.execution").
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import weakref
from collections.abc import Mapping
from typing import Any, NoReturn, cast

from celery import Task, states
from celery.backends.base import DisabledBackend
from celery.exceptions import Ignore

from dedupe.compat.celery_private import current_worker_task
from dedupe.errors import (
    ConfigurationError,
    DedupeError,
    KeyDerivationError,
    NotInstalled,
    RedisUnavailable,
)
from dedupe.events import CLAIMED, DEFERRED, RELEASED, SKIPPED, UNAVAILABLE, emit
from dedupe.recovery.held import HeldWatch, held_requests
from dedupe.runs.run import (
    GUARDS_RUNS,
    NO_RUN,
    Run,
    RunSpec,
    acks_late_leases,
    attach,
    detach,
    new_token,
    run_of,
)
from dedupe.runs.runtime import Runtime, installed, runtime_of
from dedupe.store.checks import eviction_risk
from dedupe.store.commands.leases import Lease
from dedupe.store.deferred import land_all
from dedupe.store.replies import Requeue, Take
from dedupe.values.config import SettingReader
from dedupe.values.header import LATEST, KeyHeader, is_publishing
from dedupe.values.keys import CallKeys, keys_for
from dedupe.values.latest import Latest, unpack_arguments
from dedupe.values.limits import LimitHeader
from dedupe.values.options import check_plain_task, options_for
from dedupe.values.record import HOST, Holder, pack_queued, pack_running
from dedupe.values.redelivery import horizon
from dedupe.values.timing import milliseconds, seconds_until
from dedupe.values.urls import cluster_target

from . import early_claim, limits
from .deferral import DEFERRALS, SINCE, backoff, deferrals_of, since_of
from .early_claim import Claim
from .send_again import send_again

__all__ = [
    "derived_spec",
    "drop_unread",
    "end_of_body",
    "guard",
    "on_before_publish",
    "on_internal_error",
    "on_postrun",
    "on_prerun",
    "on_process_shutdown",
    "on_worker_init",
    "on_worker_ready",
    "refuse_uninstalled",
    "requeue_for_message",
    "requeue_key",
    "send_claim",
    "spec_for_request",
]

logger = logging.getLogger("dedupe.worker")


def on_worker_init(sender: Any = None, **_: Any) -> None:
    """Refuse to start a worker whose dedupe settings or tasks are wrong (it would run every
    unique task unguarded); warn when an acks_late task's key would wait for the Redis
    broker's visibility timeout after a worker dies (:meth:`Broker.redelivery_warning
    <dedupe.brokers.broker.Broker.redelivery_warning>`)."""
    early_claim.pool_accepts_in_place(getattr(sender, "pool_cls", None))
    app = getattr(sender, "app", None)
    runtime = installed(app)
    if app is None or runtime is None:
        return
    try:
        runtime.config  # noqa: B018 (reads and checks the settings)
        for name, task in app.tasks.items():
            if not getattr(task, GUARDS_RUNS, False):
                check_plain_task(type(task), name)
    except ConfigurationError as exc:
        # SystemExit passes through Celery's signal (which logs any Exception and goes on):
        # the worker stops here, with this one line on stderr.
        message = f"celery-dedupe: the worker of app {app.main!r} cannot start: {exc}"
        raise SystemExit(message) from None
    try:
        warning = runtime.broker.redelivery_warning(acks_late_leases(app, runtime.config))
    except DedupeError as exc:  # a task's options are invalid: its runs will say so
        logger.debug("no visibility check: %s", exc)
        return
    if warning:
        logger.warning(warning)


def on_worker_ready(sender: Any = None, **_: Any) -> None:
    """Warn at start when the dedup Redis may evict live keys; on a broker other than Redis,
    watch the dedup Redis for a loss of its data (:mod:`dedupe.recovery.held`)."""
    app = getattr(sender, "app", None)
    runtime = installed(app)
    if runtime is None:
        return
    _watch_held(runtime, sender)  # (first: a dedup Redis down at start is the watch's to see)
    try:
        warning = eviction_risk(runtime.store.client)
    except RedisUnavailable as exc:  # (a Cluster no node of which answers yet)
        logger.warning("cannot check the dedup Redis's eviction settings: %s", exc)
        return
    if warning:
        logger.warning(warning)


# The watch of each app's worker (one per worker process; a new one replaces it).
_held_watches: weakref.WeakKeyDictionary[Any, HeldWatch] = weakref.WeakKeyDictionary()


def _watch_held(runtime: Runtime, consumer: Any) -> None:
    # A Redis broker names the messages a worker holds in its unacked hash (dedupe.recovery.unacked
    # restores them from there, or loses them with the records where it is the dedup store);
    # a Cluster has many servers to lose data, one at a time.
    if runtime.redis_redelivery is not None or cluster_target(runtime.config.redis_url):
        return
    config = runtime.config
    every = config.default_lease / 3
    try:
        client = runtime.watch_client(socket_timeout=every + 5)
    except Exception as exc:  # a watch is no reason to fail the worker's start
        logger.warning("cannot watch the dedup Redis for a loss of its data: %r", exc)
        return
    watch = HeldWatch(
        runtime.store,
        cast("Any", client),
        prefix=config.key_prefix,
        default_ttl=config.default_ttl,
        every=every,
        held=functools.partial(held_requests, consumer),
        enable_utc=bool(_enable_utc(runtime.app)),
    )
    previous = _held_watches.get(runtime.app)
    if previous is not None:
        previous.stop()
    _held_watches[runtime.app] = watch
    watch.start()


# -- where the run's spec comes from ---------------------------------------------------------


def spec_for_request(
    runtime: Runtime, task: Any, request: Any, args: Any, kwargs: Any
) -> RunSpec | None:
    """The spec of a run: from the message header (``request.headers``, not an attribute:
    in eager mode only the dict has it), or derived for a guarded task's message that
    bypassed the producer path (send_task, sent before install)."""
    header = KeyHeader.read(getattr(request, "headers", None))
    canvas = _in_canvas(request)
    if header is None:
        return derived_spec(runtime, task, args, kwargs, canvas=canvas)
    return _carried_spec(runtime, task, header, canvas)


def _carried_spec(runtime: Runtime, task: Any, header: KeyHeader, canvas: bool) -> RunSpec:
    options = options_for(task, task.name, runtime.config)
    ttl = header.ttl if header.ttl is not None else options.ttl
    return RunSpec.from_options(
        header.keys, header.until, ttl, options, canvas=canvas, carried=True
    )


def _in_canvas(request: Any) -> bool:
    return bool(
        request.chain or request.callbacks or request.errbacks or request.chord or request.group
    )


def derived_spec(
    runtime: Runtime, task: Any, args: Any, kwargs: Any, *, canvas: bool = False
) -> RunSpec | None:
    """The spec of a run of a guarded task whose message carries no header; None for a task
    that is neither ``unique`` nor ``exclusive``."""
    if not (getattr(task, "unique", False) or getattr(task, "exclusive", False)):
        return None
    options = options_for(task, task.name, runtime.config)
    keys = keys_for(runtime.config.key_prefix, task, task.name, options, args, kwargs)
    return RunSpec.from_options(keys, options.until, options.ttl, options, canvas=canvas)


# -- the run's start ---------------------------------------------------------------------------


def on_prerun(
    sender: Any = None,
    task_id: str = "",
    task: Any = None,
    args: Any = None,
    kwargs: Any = None,
    **_: Any,
) -> None:
    """``task_prerun``: claim the run's key."""
    task = task or sender
    runtime = installed(task.app)
    request = task.request
    if runtime is None or request.is_eager or request.called_directly:
        return
    sent = early_claim.take(task_id)
    if sent is not None:
        # Sent as its message was accepted (send_claim): the plain case, its spec read from
        # these very headers. (A canvas, in the body only, does not change the claim.)
        if _in_canvas(request):
            sent.spec = dataclasses.replace(sent.spec, canvas=True)
        attach(request, _claim(runtime, task, sent))
        return
    limit = LimitHeader.read(getattr(request, "headers", None))
    if limit is not None:
        limits.enter(runtime, task, task_id, limit)
        return
    try:
        spec = spec_for_request(runtime, task, request, args or (), kwargs or {})
    except KeyDerivationError as exc:
        logger.error("%s[%s] runs unguarded: %s", task.name, task_id, exc)
        return
    if spec is None:
        return
    # A message the producer accepted, on its first delivery: its call was accepted, so it
    # runs even where another call's queued record holds the key (that call goes next). A
    # message deferred before carries the key of its re-publication, not of an acceptance.
    headers = getattr(request, "headers", None)
    accepted = spec.carried and not deferrals_of(headers)
    latest = _latest_mode(request, spec)
    if latest == "debounce":
        early = _look_latest(runtime, task, task_id, request, spec)
        if early is Take.ENDED:
            _ended_already(request, spec.keys.run)  # (claims nothing: guard() skips it)
            return
        if early is not None and not early.due:
            # Before its burst's deadline: claim nothing (the burst goes on), and go again
            # for the deadline, with the latest arguments (guard()).
            attach(request, Run(spec, new_token(), "early", latest=early))
            return
    claim = Claim.of(task_id, spec, accepted, _record_ttl_ms(runtime, task, spec))
    run = _claim(runtime, task, claim)
    attach(request, run)
    if latest and run.verdict == "claimed":
        _take_latest(runtime, task, task_id, request, run)
    elif (
        latest == "replace"
        and run.verdict == "held"
        and _look_latest(runtime, task, task_id, request, spec) is Take.ENDED
    ):
        # Its run ended already. Held off, it would be deferred and wait in line in the
        # holder's place, the calls made meanwhile its duplicates, leaving their arguments
        # to a message that never runs them. (Asked only where the key is held.)
        _ended_already(request, spec.keys.run)


def _latest_mode(request: Any, spec: RunSpec) -> str | None:
    """``"debounce"`` or ``"replace"``: the run of a call whose duplicates leave their
    arguments for it (only a message the producer accepted says so); else None."""
    if not spec.carried:
        return None
    mode = (getattr(request, "headers", None) or {}).get(LATEST)
    return str(mode) if mode else None


def _look_latest(
    runtime: Runtime, task: Any, task_id: str, request: Any, spec: RunSpec
) -> Latest | Take | None:
    retries = int(request.retries or 0)
    try:
        return runtime.store.take_latest(spec.keys, task_id, retries, now=time.time())
    except RedisUnavailable as exc:
        action = "runs now (its deadline unknown)"
        emit(UNAVAILABLE, task.name, task_id, spec.keys.latest, action=action, error=exc.cause)
        return None


def _take_latest(runtime: Runtime, task: Any, task_id: str, request: Any, run: Run) -> None:
    # The run claimed its key: no duplicate can leave arguments for it any more (a call now
    # is a duplicate of the run, or, unique_until="started", the next call). It takes the
    # last ones left, in place of its message's.
    try:
        latest = runtime.store.take_latest(run.spec.keys, task_id, int(request.retries or 0))
    except RedisUnavailable as exc:
        action = "runs with its message's arguments"
        emit(UNAVAILABLE, task.name, task_id, run.spec.keys.latest, action=action, error=exc.cause)
        return
    if latest is Take.ENDED:
        _ended_already(request, run.spec.keys.run)  # (its claim is freed as it ends)
        return
    if latest is None:
        return
    args, kwargs = unpack_arguments(latest.body, task.app.conf.accept_content)
    run.latest, run.arguments = latest, (args, kwargs)
    # (What Celery reports of the run, and a retry from its body, carry them too.)
    request.args, request.kwargs = args, kwargs


# On the request of a message whose run ended already (a redelivery: its ack was lost): the
# run's key, for guard() to name as it skips the run.
_ENDED_ALREADY = "_dedupe_ended_already"


def _ended_already(request: Any, key: str) -> None:
    setattr(request, _ENDED_ALREADY, key)


def _skip_ended(task: Task[Any, Any], task_id: str, key: str) -> NoReturn:
    # The broker delivered again the message of a run that ended (a broker cut or a killed
    # worker lost its ack): running it would be the burst's second run, with its message's
    # own arguments, the burst's first call's. Its result is the ended run's (kept: nothing
    # is stored); Ignore acks the message. A claim it made is released as it ends.
    reason = "its run ended already (the message was delivered again)"
    emit(SKIPPED, task.name, task_id, key, None, reason=reason)
    raise Ignore()


def _claim(runtime: Runtime, task: Any, claim: Claim) -> Run:
    """Claim the run's key, or read the claim sent as its message was accepted."""
    spec, task_id = claim.spec, claim.task_id
    store = runtime.store
    try:
        if claim.error is not None:
            raise claim.error
        if claim.slot is None:
            holder = store.claim(spec.keys, task_id, *claim.arguments(), **claim.options())
        else:
            holder = store.claim_result(spec.keys, claim.slot)
    except RedisUnavailable as exc:
        # The message is consumed already: running it beats losing it. (Its end frees
        # what a claim that landed unanswered wrote.)
        action = "runs unguarded"
        emit(UNAVAILABLE, task.name, task_id, spec.keys.run, action=action, error=exc.cause)
        return Run(spec, claim.token, "error")
    return _claimed(runtime, task, claim, holder)


def send_claim(request: Any) -> None:
    """Send a run's claim as the worker accepts its message, in the thread that runs it,
    the reply read as the run starts (early_claim.py). Only a message of the plain case, a
    producer's key and nothing else to do first; any other claims as it starts. Never
    raises (Celery would neither ack nor run the message): the run claims as it starts."""
    if not early_claim.sends_at_acceptance():
        return
    unread = early_claim.take_any()
    if unread is not None:
        # Its run never started, and Celery reported no end for it: its message was acked
        # as it was accepted (never acks_late here), and is gone.
        drop_unread(request.task, unread, consumed=True)
    try:
        claim = _claim_to_send(request)
    except Exception:
        logger.exception("%s[%s] claims as it starts", request.name, request.id)
        return
    if claim is None:
        return
    try:
        claim.slot = runtime_of(request.task.app).store.start_claim(
            claim.spec.keys, claim.task_id, *claim.arguments(), **claim.options()
        )
    except RedisUnavailable as exc:
        claim.error = exc  # (the run says so as it starts)
    except Exception:
        logger.exception("%s[%s] claims as it starts", request.name, request.id)
    early_claim.keep(claim)


def _claim_to_send(request: Any) -> Claim | None:
    task = request.task
    runtime = installed(task.app)
    headers = request.request_dict
    if (
        runtime is None
        or task.acks_late
        or LimitHeader.read(headers) is not None
        or headers.get(LATEST)
        or (header := KeyHeader.read(headers)) is None
    ):
        return None
    spec = _carried_spec(runtime, task, header, canvas=False)
    accepted = not deferrals_of(headers)  # (as on_prerun has it, for a carried spec)
    claim = Claim.of(request.id, spec, accepted, _record_ttl_ms(runtime, task, spec))
    claim.name = task.name
    return claim


def on_internal_error(sender: Any = None, task_id: str = "", **_: Any) -> None:
    """``task_internal_error``: Celery could not run a message it accepted (its keyword
    arguments are not a mapping, say), before ``task_prerun``: undo the claim sent."""
    unread = early_claim.take(task_id)
    if unread is not None and sender is not None:
        drop_unread(sender, unread, consumed=True)  # (acked as it was accepted)


def drop_unread(task: Any, claim: Claim, *, consumed: bool) -> None:
    """Undo a claim sent as its message was accepted, whose run never started (Celery ended
    the request first): released if the message is consumed (acked), else its record goes
    back to queued, for the message's next delivery. Never raises (Celery's own handling
    goes on); a claim it cannot undo is left to its lease."""
    runtime = installed(task.app)
    if runtime is None:
        return
    keys = claim.spec.keys
    try:
        if claim.slot is not None and runtime.store.claim_result(keys, claim.slot) is not None:
            return  # (held by another run: it wrote nothing)
        if consumed:
            runtime.store.release(keys, claim.task_id, claim.token)
        else:
            requeue_key(runtime, keys, claim.spec.ttl, claim.task_id, claim.token, 0.0)
    except Exception as exc:  # (Redis unreachable, or a bug: the lease frees the key)
        action = "never started, and its claim was not undone (its lease frees it)"
        emit(UNAVAILABLE, claim.name, claim.task_id, keys.run, action=action, error=exc)
        return
    logger.debug("%s[%s] never started: its claim is undone", claim.name, claim.task_id)


def _claimed(runtime: Runtime, task: Any, claim: Claim, holder: Holder | None) -> Run:
    spec, task_id = claim.spec, claim.task_id
    if holder is not None:
        if not getattr(task, GUARDS_RUNS, False):
            logger.warning(
                "%s[%s] runs while %s holds its key: only tasks with base=dedupe.DedupeTask "
                "are kept from running concurrently",
                task.name,
                task_id,
                holder.task_id,
            )
        return Run(spec, claim.token, "held", holder=holder)
    record = pack_running(task_id, claim.token, HOST, claim.pid, claim.now)
    call_key = spec.keys.call if spec.keys.call != spec.keys.run else ""
    lease = Lease(
        spec.keys.run, task_id, claim.token, claim.lease_ms, record, claim.record_ttl_ms, call_key
    )
    runtime.heartbeat.hold(lease, task.name)
    emit(CLAIMED, task.name, task_id, spec.keys.run)
    return Run(spec, claim.token, "claimed", lease=lease)


def _record_ttl_ms(runtime: Runtime, task: Any, spec: RunSpec) -> int:
    """How long the running record outlives each renewal: until the broker delivers the
    message again, for a run that holds an unacked message (acks_late: a worker killed
    whole leaves it with the broker); 0, the lease alone, for any other run (its message
    was acked when received, and a dead run's key is free once its lease is over). Only
    with unique_until="finished": the other modes' run lock is a mutex alone (their calls
    are accepted during a run by design), and holding it for a redelivery would only make
    the calls queued behind it wait out the broker's timeout."""
    if not task.acks_late or spec.until != "finished":
        return 0
    return milliseconds(horizon(runtime.redis_redelivery, spec.lease, spec.ttl))


def refuse_uninstalled(task: Task[Any, Any], task_id: str) -> None:
    """Fail a guarded task's run in a worker whose app ``dedupe.install`` was never called
    for, loudly and with the fix, after freeing its message's key: without install no
    claim, no release and no guard runs, and the key would name a finished task for its
    whole ttl."""
    app = task.app
    if installed(app) is not None or task.request.is_eager:
        return  # (eager: the caller's own process, no message, no key)
    header = KeyHeader.read(getattr(task.request, "headers", None))
    outcome = "it carried no key"
    if header is not None:
        try:
            _bare_runtime(app).store.cancel(header.keys, task_id)
            outcome = f"its key {header.keys.call} is freed"
        except DedupeError as exc:
            outcome = f"its key {header.keys.call} could not be freed ({exc}): its ttl frees it"
    error = NotInstalled(str(app.main))
    logger.error("%s[%s] is refused, and %s: %s", task.name, task_id, outcome, error)
    raise error


# Only to free the keys of refused runs: settings and a Redis client, no signal handlers.
_bare_runtimes: weakref.WeakKeyDictionary[Any, Runtime] = weakref.WeakKeyDictionary()


def _bare_runtime(app: Any) -> Runtime:
    runtime = _bare_runtimes.get(app)
    if runtime is None:
        runtime = _bare_runtimes[app] = Runtime(app)
    return runtime


def guard(task: Task[Any, Any], task_id: str) -> None:
    """Stop a run whose key another run holds: skip it (Ignore) or try it again later."""
    request = task.request
    ended = getattr(request, _ENDED_ALREADY, None)
    if ended is not None:
        setattr(request, _ENDED_ALREADY, None)
        _skip_ended(task, task_id, ended)
    limits.wait_turn(task)
    run = run_of(request)
    if run is not None and run.verdict == "early":
        _go_again_at_deadline(task, request, run)
    if run is None or run.verdict != "held":
        return
    holder = run.holder
    assert holder is not None
    spec = run.spec
    if (
        spec.until != "finished"
        or spec.canvas
        or spec.carried
        or spec.on_running == "retry"
        or holder.task_id == task_id
    ):
        # Retrying is the only safe move for these: a started- or window-mode call must run
        # after the current run, a canvas member must not cut its workflow, a message the producer
        # accepted may be some caller's holder (a skip would leave its .get() hanging), and
        # a copy of the holder's own task id may be the only copy left if the holder died.
        # Each deferral of a message waits twice as long as the one before, up to the cap,
        # and a message gives up after max_deferrals (a holder that never lets go).
        key = spec.keys.run
        config = runtime_of(task.app).config
        headers = getattr(request, "headers", None)
        deferrals = deferrals_of(headers)
        if deferrals < config.max_deferrals:
            countdown = backoff(spec.running_countdown, deferrals, config.deferral_cap)
            deferral = deferrals + 1
            since = since_of(headers) or time.time()
            emit(DEFERRED, task.name, task_id, key, holder, countdown=countdown, deferral=deferral)
            if spec.until != "window" and spec.carried and holder.task_id != task_id:
                _wait_in_line(runtime_of(task.app), task.name, task_id, spec, since)
            _defer(task, request, countdown, deferral, since)
        logger.warning(
            "%s[%s] gives up after %d deferrals: %s is still %s (dedupe_max_deferrals)",
            task.name,
            task_id,
            deferrals,
            holder.task_id,
            holder.state,
        )
        _free_given_up(runtime_of(task.app), task.name, task_id, spec)
        reason = f"gave up after {deferrals} deferrals (dedupe_max_deferrals)"
    else:
        reason = "on_running='skip'"
    held_by = f"{holder.task_id} is {holder.state}"
    emit(SKIPPED, task.name, task_id, spec.keys.run, holder, reason=held_by)
    _store_skipped(task, request, task_id, holder, reason)
    raise Ignore()


def _go_again_at_deadline(task: Task[Any, Any], request: Any, run: Run) -> NoReturn:
    # A debounced message that came before its burst's deadline: the same task id is sent
    # again for the deadline, with the latest arguments (its key goes back to queued for it,
    # as for a retry), and this delivery ends as RETRY. A retry from the body is not counted.
    latest = run.latest
    assert latest is not None
    request.args, request.kwargs = unpack_arguments(latest.body, task.app.conf.accept_content)
    countdown = max(latest.deadline - time.time(), 0.0)
    signature = task.signature_from_request(request, countdown=countdown)
    logger.debug("%s[%s] is early: sent again in %.3f s", task.name, request.id, countdown)
    send_again(task, request, signature, countdown)


def _wait_in_line(
    runtime: Runtime, task_name: str, task_id: str, spec: RunSpec, since: float
) -> None:
    # A message the producer accepted, held off by another task id: its own record is gone
    # (a Redis restart or failover lost it), or that task could not hold the key. It takes
    # its place again, so that calls made while it waits are its duplicates, not new tasks
    # that win the key before its next try (and again, and again).
    record = pack_queued(task_id, time.time(), None)
    try:
        runtime.store.wait(spec.keys, task_id, record, milliseconds(spec.ttl), since)
    except RedisUnavailable as exc:
        action = "waits without its key"
        emit(UNAVAILABLE, task_name, task_id, spec.keys.call, action=action, error=exc.cause)


def _free_given_up(runtime: Runtime, task_name: str, task_id: str, spec: RunSpec) -> None:
    # A message that gives up never runs: its queued record (started mode: a call accepted
    # during a run; or a call waiting in a run's record) would answer calls for its ttl with a
    # task that is over. A throttle window's record stays: it is the window.
    if spec.until == "window":
        return
    try:
        runtime.store.cancel(spec.keys, task_id)
    except RedisUnavailable as exc:
        action = "gave up and its key was not freed (its ttl frees it)"
        emit(UNAVAILABLE, task_name, task_id, spec.keys.call, action=action, error=exc.cause)


def _store_skipped(
    task: Task[Any, Any], request: Any, task_id: str, holder: Holder, why: str
) -> None:
    # A skip stores its end, so the caller's .get() raises (TaskRevokedError naming the
    # holder) instead of waiting on PENDING forever.
    if request.ignore_result or getattr(task, "ignore_result", False):
        return
    reason = f"skipped: {task.name}[{holder.task_id}] is {holder.state} with the same key ({why})"
    try:
        task.backend.mark_as_revoked(task_id, reason, request=request)
    except Exception as exc:  # a result store that fails is no reason to run the task
        logger.warning(
            "%s[%s] skipped; its result could not be stored: %r", task.name, task_id, exc
        )


def _defer(
    task: Task[Any, Any], request: Any, countdown: float, deferral: int, since: float
) -> NoReturn:
    # Like task.retry(), but a deferral does not count as a retry: the task's own
    # max_retries is left for its own failures. The message counts its deferrals itself.
    signature = task.signature_from_request(request, countdown=countdown)
    headers = signature.options.get("headers") or {}
    signature.options["headers"] = {**headers, DEFERRALS: deferral, SINCE: since}
    send_again(task, request, signature, countdown)


# -- continuations that tasks of other bases publish ------------------------------------------


def on_before_publish(sender: Any = None, headers: Any = None, **_: Any) -> None:
    """``before_task_publish`` in a run: a retry (or replace) of the running task id, sent by a
    task of another base class (a DedupeTask's own apply_async handles its continuations),
    takes the key back to queued before its message exists (it may start at once elsewhere).
    """
    if is_publishing() or not headers:
        return
    current = current_worker_task()
    header = KeyHeader.read(headers)
    task_id = headers.get("id")
    if current is None or header is None or not task_id or current.request.id != task_id:
        return  # not in a run, not our message, or a new call with copied headers
    run = run_of(current.request)
    runtime = installed(current.app)
    if run is None or run.requeued or runtime is None:
        return
    ttl, delay = _ttl_and_delay(runtime, header, headers)
    if run.hand_over_at_end(current, header.keys, ttl, time.time() + delay if delay else None):
        return  # on_postrun hands the key over
    token = run.hand_over(header.keys, runtime.heartbeat)
    if token != NO_RUN:
        requeue_for_message(runtime, header, task_id, token, headers)


def requeue_for_message(
    runtime: Runtime, header: KeyHeader, task_id: str, token: str, headers: Mapping[str, Any]
) -> None:
    """Requeue a key for the message about to be published with ``headers``."""
    ttl, delay = _ttl_and_delay(runtime, header, headers)
    try:
        requeue_key(runtime, header.keys, ttl, task_id, token, delay)
    except RedisUnavailable as exc:
        task_name = str(headers.get("task") or "")
        action = "is sent again without its key (not requeued)"
        emit(UNAVAILABLE, task_name, task_id, header.keys.call, action=action, error=exc.cause)


def _ttl_and_delay(
    runtime: Runtime, header: KeyHeader, headers: Mapping[str, Any]
) -> tuple[float, float]:
    """The record ttl a message's header asks for, and the seconds until its eta."""
    enable_utc = bool(_enable_utc(runtime.app))
    delay = seconds_until(headers.get("eta"), time.time(), enable_utc=enable_utc)
    return (header.ttl if header.ttl is not None else runtime.config.default_ttl), delay


_enable_utc = SettingReader("enable_utc")


# -- the run's end -------------------------------------------------------------------------------


def end_of_body(task: Any, *, failed: bool) -> None:
    """A DedupeTask's body returned, or raised an error that ends its run: free the key now,
    before Celery stores the result (a caller's ``.get()`` must never return while the key
    still names this finished run). Not a retry's, a reject's or a handed-over key: those
    stay for ``task_postrun``, as do runs of other bases (:func:`on_postrun`)."""
    run = run_of(task.request)
    runtime = installed(task.app)
    if (
        runtime is None
        or run is None
        or run.verdict != "claimed"
        or run.requeued
        or run.released
        or run.handover is not None
    ):
        return
    if run.lease is not None:
        runtime.heartbeat.drop(run.lease)
        run.lease = None
    run.released = True
    # With a result to store, the release is read before it; else later (_release).
    wait = _stores_result(task, task.request, failed)
    _release(runtime, task, task.request.id, run, wait=wait)


def _release(runtime: Runtime, task: Any, task_id: str, run: Run, *, wait: bool) -> None:
    """Free a claimed run's key: its reply read now (``wait``), or sent at once and read
    before this thread's next command to Redis (the next run's claim), by the sweeper
    within a fraction of a second, or as the pool process exits (:func:`on_process_shutdown`);
    sent again on a new connection if the old one died. (Read at the run's end, it cost a
    look at the socket that almost never found it: the reply was on its way.)"""
    keys = run.spec.keys
    try:
        if _latest_mode(task.request, run.spec):
            # (Sent first: a release waited for lands it too, before the result and the ack.)
            _send_end_latest(runtime, task.request, task_id, run)
        if wait:
            runtime.store.release(keys, task_id, run.token)
        else:
            runtime.store.send_release(keys, task_id, run.token)
    except RedisUnavailable as exc:
        emit(UNAVAILABLE, task.name, task_id, keys.run, action=_NOT_FREED, error=exc.cause)
    else:
        emit(RELEASED, task.name, task_id, keys.run)


def _send_end_latest(runtime: Runtime, request: Any, task_id: str, run: Run) -> None:
    # The take kept for a resend goes, and the run's tombstone stays for as long as the broker
    # may deliver its message again: that delivery finds it, and does not run the burst twice
    # (a run killed before this point has none, and runs again with the take it kept).
    spec = run.spec
    horizon_ms = milliseconds(horizon(runtime.redis_redelivery, spec.lease, spec.ttl))
    retries = int(request.retries or 0)
    runtime.store.send_end_latest(spec.keys, task_id, retries, horizon_ms)


#: What a run's end did not do, when Redis could not be reached.
_NOT_FREED = "ended and its key was not freed (its lease frees it)"


def _stores_result(task: Any, request: Any, failed: bool) -> bool:
    """May Celery store this run's outcome where a caller reads it? When in doubt, yes."""
    if isinstance(task.backend, DisabledBackend):
        return False
    if not (task.ignore_result and getattr(request, "ignore_result", False)):
        return True
    return failed and bool(getattr(task, "store_errors_even_if_ignored", False))


def on_postrun(
    sender: Any = None,
    task_id: str = "",
    task: Any = None,
    retval: Any = None,
    state: str | None = None,
    **_: Any,
) -> None:
    """``task_postrun``: release the run's key (or requeue it with its message)."""
    task = task or sender
    run = detach(task.request)
    runtime = installed(task.app)
    if runtime is not None and limits.limited_run_of(task.request) is not None:
        limits.leave(runtime, task)
    if run is None or runtime is None:
        return
    if run.lease is not None:
        runtime.heartbeat.drop(run.lease)
    if run.released:
        return
    if run.verdict == "held" or run.requeued:
        # Never touch the holder's record. A continuation (retry, replace) put the key back
        # to queued before its message was published; that message owns it now. (A RETRY
        # without one, a bare `raise Retry()`, publishes nothing and is released below.)
        return
    if run.handover is not None:
        _hand_over(runtime, task, task_id, run, *run.handover)
        return
    rejected = state == states.REJECTED and getattr(retval, "requeue", False)
    if run.verdict == "claimed" and not (rejected and task.acks_late):
        _release(runtime, task, task_id, run, wait=False)
        return
    # A run whose claim failed (Redis was unreachable) holds no run: it speaks for its
    # queued record only, never for a copy of its task id that claimed since.
    token = run.token if run.verdict == "claimed" else NO_RUN
    spec = run.spec
    try:
        if rejected and task.acks_late:
            # The message goes back to the queue, and the record with it. (Without
            # acks_late the message was acked already: a requeue loses it.)
            requeue_key(runtime, spec.keys, spec.ttl, task_id, token, 0.0)
        else:
            # The claim's fate is unknown (Redis did not answer in time): it may have landed
            # after the worker gave up, as a running record of this run's token that no
            # heartbeat renews. Free it, and the queued record the claim would have replaced
            # (not a throttle window's: it lives out its ttl).
            runtime.store.release(spec.keys, task_id, run.token)
            if spec.until != "window":
                runtime.store.cancel(spec.keys, task_id)
            emit(RELEASED, task.name, task_id, spec.keys.run)
    except RedisUnavailable as exc:
        emit(UNAVAILABLE, task.name, task_id, spec.keys.run, action=_NOT_FREED, error=exc.cause)


def on_process_shutdown(**_: Any) -> None:
    """``worker_process_shutdown``: a pool process about to exit (``os._exit``: no atexit)
    lands the releases it sent."""
    land_all()


def _hand_over(
    runtime: Runtime, task: Any, task_id: str, run: Run, ttl: float, eta: float | None
) -> None:
    """The run is over: its key goes back to queued for the continuation it published."""
    delay = max(0.0, eta - time.time()) if eta is not None else 0.0
    try:
        requeue_key(runtime, run.spec.keys, ttl, task_id, run.token, delay)
    except RedisUnavailable as exc:
        action = "ended and its key was not handed to its retry (its lease frees it)"
        emit(UNAVAILABLE, task.name, task_id, run.spec.keys.run, action=action, error=exc.cause)
    else:
        emit(RELEASED, task.name, task_id, run.spec.keys.run, requeued=True)


def requeue_key(
    runtime: Runtime, keys: CallKeys, ttl: float, task_id: str, token: str, delay: float
) -> Requeue:
    """Put a task id's key back to queued for its next message, ``delay`` seconds away."""
    now = time.time()
    record = pack_queued(task_id, now, now + delay if delay else None)
    outcome = runtime.store.requeue(keys, task_id, token, record, milliseconds(ttl + delay))
    if outcome is not Requeue.QUEUED:
        logger.debug("the key of %s stays with its holder (%s)", task_id, outcome.name.lower())
    return outcome
