"""``task_prerun``: a run claims its key (or reads the claim sent as its message was
accepted), a limited run asks for its turn, and the run of a call whose duplicates leave
their arguments takes the latest ones."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from celery.app.task import Context

from dedupe.errors import DedupeError, KeyDerivationError, RedisUnavailable
from dedupe.events import UNAVAILABLE, emit
from dedupe.runs.run import Run, RunSpec, attach, new_token
from dedupe.runs.runtime import Runtime, installed
from dedupe.store.replies import Take
from dedupe.surfaces import AnyTask, RequestSurface, TaskSurface
from dedupe.values.key_derivation import keys_for
from dedupe.values.latest import Latest, unpack_arguments
from dedupe.values.limits import LIMIT, LimitHeader
from dedupe.values.options import GUARDS_RUNS, limit_header, options_for

from . import early_claim, limited_runs
from .claim import RunClaim, claim_run, record_ttl_ms
from .deferral import deferrals_of
from .run_spec import in_canvas, latest_mode, spec_for_request

__all__ = ["on_prerun", "take_ended_already"]

logger = logging.getLogger("dedupe.worker")


def on_prerun(
    sender: Any = None,
    task_id: str = "",
    task: AnyTask | None = None,
    args: Sequence[object] | None = None,
    kwargs: Mapping[str, object] | None = None,
    **_: object,
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
        if in_canvas(request):
            sent.spec = dataclasses.replace(sent.spec, canvas=True)
        attach(request, claim_run(runtime, task, sent))
        return
    limit = LimitHeader.read(getattr(request, "headers", None)) or _derived_limit(
        runtime, task, request, args or (), kwargs or {}
    )
    if limit is not None:
        limited_runs.enter(runtime, task, task_id, limit)
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
    latest = latest_mode(request, spec)
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
    claim = RunClaim.of(task_id, spec, accepted, record_ttl_ms(runtime, task, spec))
    run = claim_run(runtime, task, claim)
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


def _look_latest(
    runtime: Runtime, task: TaskSurface, task_id: str, request: RequestSurface, spec: RunSpec
) -> Latest | Take | None:
    retries = int(request.retries or 0)
    try:
        return runtime.store.take_latest(spec.keys, task_id, retries, now=time.time())
    except RedisUnavailable as exc:
        action = "runs now (its deadline unknown)"
        emit(UNAVAILABLE, task.name, task_id, spec.keys.latest, action=action, error=exc.cause)
        return None


def _take_latest(runtime: Runtime, task: AnyTask, task_id: str, request: Context, run: Run) -> None:
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


def _ended_already(request: object, key: str) -> None:
    setattr(request, _ENDED_ALREADY, key)


def take_ended_already(request: object) -> str | None:
    """The key of the run that ended already, if the request's message is its redelivery
    (once)."""
    ended: str | None = getattr(request, _ENDED_ALREADY, None)
    if ended is not None:
        setattr(request, _ENDED_ALREADY, None)
    return ended


def _derived_limit(
    runtime: Runtime,
    task: AnyTask,
    request: Context,
    args: Sequence[object],
    kwargs: Mapping[str, object],
) -> LimitHeader | None:
    """The limit of a message of a limited task that came without one (``send_task``, a call
    by name from a process that does not import the task, a canvas member, beat): the task's
    options say it, and the run takes its turn like any other. The header is written into
    the request's headers, so that the message published again if it waits carries it.
    Only a DedupeTask has limits: another task's attributes are not read (another library's
    base may own our names, celery-singleton's ``on_duplicate`` a method)."""
    if not getattr(task, GUARDS_RUNS, False):
        return None
    try:
        options = options_for(task, task.name, runtime.config)
        if not options.limited:
            return None
        keys = keys_for(runtime.config.key_prefix, task, task.name, options, args, kwargs)
        limit = limit_header(options, keys.call, task.name, args, kwargs)
    except DedupeError as exc:
        logger.error("%s[%s] runs without its limit: %s", task.name, request.id, exc)
        return None
    headers = dict(getattr(request, "headers", None) or {})
    headers[LIMIT] = limit.encode()
    request.headers = headers
    return limit
