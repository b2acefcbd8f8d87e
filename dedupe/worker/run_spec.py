"""Where a run's spec comes from: its message's header, or, for a guarded task's message that
bypassed the producer path, the task's options and the call's arguments."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dedupe.runs.run import RunSpec
from dedupe.runs.runtime import Runtime
from dedupe.surfaces import AnyTask, RequestSurface
from dedupe.values.header import LATEST, KeyHeader
from dedupe.values.key_derivation import keys_for
from dedupe.values.options import dedupes_every_call, options_for

__all__ = ["carried_spec", "derived_spec", "in_canvas", "latest_mode", "spec_for_request"]


def spec_for_request(
    runtime: Runtime,
    task: AnyTask,
    request: RequestSurface,
    args: Sequence[object],
    kwargs: Mapping[str, object],
) -> RunSpec | None:
    """The spec of a run: from the message header (``request.headers``, not an attribute:
    in eager mode only the dict has it), or derived for a guarded task's message that
    bypassed the producer path (send_task, sent before install)."""
    header = KeyHeader.read(getattr(request, "headers", None))
    canvas = in_canvas(request)
    if header is None:
        return derived_spec(runtime, task, args, kwargs, canvas=canvas)
    return carried_spec(runtime, task, header, canvas)


def carried_spec(runtime: Runtime, task: AnyTask, header: KeyHeader, canvas: bool) -> RunSpec:
    """The spec of a run whose message carries the producer's ``header``."""
    options = options_for(task, task.name, runtime.config)
    ttl = header.ttl if header.ttl is not None else options.ttl
    return RunSpec.from_options(
        header.keys, header.until, ttl, options, canvas=canvas, carried=True
    )


def in_canvas(request: RequestSurface) -> bool:
    """Is the run a member of a canvas (a chain, a chord, a group, or with callbacks)?"""
    return bool(
        request.chain or request.callbacks or request.errbacks or request.chord or request.group
    )


def derived_spec(
    runtime: Runtime,
    task: AnyTask,
    args: Sequence[object],
    kwargs: Mapping[str, object],
    *,
    canvas: bool = False,
) -> RunSpec | None:
    """The spec of a run of a guarded task whose message carries no header; None for a task
    that is neither ``unique`` nor ``exclusive``."""
    if not (dedupes_every_call(task) or getattr(task, "exclusive", False)):
        return None
    options = options_for(task, task.name, runtime.config)
    keys = keys_for(runtime.config.key_prefix, task, task.name, options, args, kwargs)
    return RunSpec.from_options(keys, options.until, options.ttl, options, canvas=canvas)


def latest_mode(request: RequestSurface, spec: RunSpec) -> str | None:
    """``"debounce"`` or ``"replace"``: the run of a call whose duplicates leave their
    arguments for it (only a message the producer accepted says so); else None."""
    if not spec.carried:
        return None
    mode = (getattr(request, "headers", None) or {}).get(LATEST)
    return str(mode) if mode else None
