"""A call that continues its task id (a retry, a replace, a message sent again after its
worker was lost) rather than making a new one: the keys it keeps and the run it speaks for."""

from __future__ import annotations

from dataclasses import dataclass

from dedupe.runs.run import NO_RUN, Run, run_of
from dedupe.runs.runtime import Runtime
from dedupe.surfaces import AnyTask
from dedupe.values.header import KeyHeader
from dedupe.values.keys import CallKeys

from .call import Call

__all__ = ["Continuation", "continuation_of", "hand_over_token"]


@dataclass(frozen=True, slots=True)
class Continuation:
    """A call that continues its task id rather than making a new one."""

    #: Made inside the run of that task id (retry, replace), else by the worker's main
    #: process (retry_on_worker_lost).
    in_run: bool
    run: Run | None
    #: The header its message carried, when this call is the same call again.
    header: KeyHeader | None
    #: The task whose run continues (None outside any run).
    task: AnyTask | None = None


def continuation_of(call: Call, task_id: str) -> Continuation | None:
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
        return Continuation(True, run, header, current)
    header = KeyHeader.read(headers)
    if header is not None:
        # Our own message sent again outside its run: retry_on_worker_lost in the worker's
        # main process, after the child that ran it died.
        return Continuation(False, None, header)
    return None


def hand_over_token(
    runtime: Runtime,
    continuation: Continuation,
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
