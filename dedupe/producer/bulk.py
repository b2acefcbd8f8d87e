"""Bulk unique enqueue: many calls of one task decided in one round trip.

A batch decides first: one pipelined round trip of ``enqueue`` writes a provisional record for
each distinct call and answers which are duplicates (no message is built for those). The
accepted calls are then published through Celery, each message as Celery and kombu build it;
on a Redis broker that is the dedup store their pushes are held back and sent together, each
with its record through ``publish``, in a second round trip, and what Celery's apply_async
would read again for every call is read once for the batch (:mod:`dedupe.producer.call_sender`).
Elsewhere each publish goes to the broker and the records are confirmed without waiting (as
a single call does).

Design notes: docs/design-notes.md, "dedupe.producer.bulk".
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

from celery import Celery

from dedupe.brokers.declarations import declaring_once
from dedupe.errors import ConfigurationError, RedisUnavailable
from dedupe.runs.runtime import Runtime
from dedupe.store.commands.batches import LatestCall
from dedupe.store.replies import Push
from dedupe.surfaces import TaskOrName
from dedupe.values.record import Holder
from dedupe.values.record_state import RecordState

from .broker_budget import within_budget
from .call import Call, producer_block, publisher_for, resolve_task
from .call_sender import CallSender
from .guard import publish_prepared
from .limited_publish import is_limited, publish_limited_many
from .prepared_call import PreparedCall, forget_result
from .result import DedupeResult

__all__ = ["aapply_many", "apply_many", "publish_many"]

#: One call of a batch: its positional and keyword arguments.
CallArguments = tuple[Sequence[object], Mapping[str, object]]


def apply_many(
    task_or_name: TaskOrName,
    calls: Iterable[CallArguments],
    *,
    app: Celery | None = None,
    **options: object,
) -> list[DedupeResult]:
    """Publish many calls of a task, each unless the same call is queued or running (or
    made earlier in the batch): one round trip decides them all.

    ``calls`` holds ``(args, kwargs)`` pairs; ``options`` are Celery's apply_async options
    and the dedup call options, the same for every call (no ``task_id``: each call gets its
    own). A debounced or replacing call that is a duplicate leaves its arguments for the
    holder's run, as its ``delay`` would (calls of one key in the batch: the last one's).
    A task with ``key_concurrency`` or ``key_rate_limit`` deduplicates nothing: each call
    takes its place in line (or reserves its start) and is published, in call order.

    ```python
    results = dedupe.apply_many(refresh_report, [((42,), {}), ((43,), {}), ((42,), {})])
    [r.deduplicated for r in results]                  # [False, False, True]
    ```
    """
    if options.get("task_id") is not None:
        raise ConfigurationError(
            "apply_many: task_id cannot be given for a batch (each call needs its own id)"
        )
    task, name, app = resolve_task(task_or_name, app)
    publish = publisher_for(task, name, app)
    batch = [
        Call(app, task, name, *_arguments(name, index, call), dict(options), publish)
        for index, call in enumerate(calls)
    ]
    if not batch:
        return []
    if is_limited(batch[0]):
        return publish_limited_many(batch)
    # Calls of one task with the same options: prepared alike, but for their arguments.
    first = PreparedCall(batch[0], decide_first=True)
    shape = first.shape
    return _publish_prepared(
        [first, *(PreparedCall(call, decide_first=True, shape=shape) for call in batch[1:])]
    )


def _arguments(task_name: str, index: int, call: object) -> CallArguments:
    """One call of a batch as ``(args, kwargs)``, or an error that shows the expected form."""
    if (
        isinstance(call, (tuple, list))
        and len(call) == 2
        and (call[0] is None or isinstance(call[0], (tuple, list)))
        and (call[1] is None or isinstance(call[1], Mapping))
    ):
        return call[0] or (), call[1] or {}
    raise ConfigurationError(
        f"apply_many({task_name!r}): call {index} is {call!r}; each call is an (args, kwargs) "
        f"pair, e.g. [((1,), {{}}), ((2,), {{'full': True}})]"
    )


async def aapply_many(
    task_or_name: TaskOrName,
    calls: Iterable[CallArguments],
    *,
    app: Celery | None = None,
    **options: object,
) -> list[DedupeResult]:
    """[`apply_many`][dedupe.apply_many], awaitable: the batch runs in the loop's default
    executor (kombu blocks), shielded from the caller's cancellation (cancelled halfway, a
    batch would leave provisional records of calls it never published)."""
    calls = list(calls)
    batch = asyncio.ensure_future(
        asyncio.to_thread(apply_many, task_or_name, calls, app=app, **options)
    )
    return await asyncio.shield(batch)


def publish_many(calls: Sequence[Call]) -> list[DedupeResult]:
    """Publish ``calls`` (one task's or several), deciding the plain ones in one round trip;
    canvas members, continuations and eager calls go one by one, as they would alone."""
    return _publish_prepared([PreparedCall(call, decide_first=True) for call in calls])


def _publish_prepared(prepared: list[PreparedCall]) -> list[DedupeResult]:
    results: list[DedupeResult | None] = [None] * len(prepared)
    leaders: list[int] = []
    followers: list[tuple[int, int]] = []
    first_of: dict[str, int] = {}
    for index, call in enumerate(prepared):
        if call.kind != "enqueue":
            results[index] = publish_prepared(call)
            continue
        call.on_duplicate = "return"
        first = first_of.setdefault(call.keys.call, index)
        if first == index:
            leaders.append(index)
        else:
            followers.append((index, first))
    holders: dict[int, Holder] = {}
    if leaders:
        accepted = _decide(prepared, leaders, [index for index, _ in followers], results, holders)
        _publish_accepted(prepared, accepted, results, holders)
    for index, first in followers:
        holder = holders.get(first) or _holder_of(prepared[first])
        holders[index] = holder
        results[index] = prepared[index].duplicate(holder)
    done = [result for result in results if result is not None]
    assert len(done) == len(results), "a call of the batch was left without a result"
    return done


def _decide(
    prepared: list[PreparedCall],
    leaders: list[int],
    followers: list[int],
    results: list[DedupeResult | None],
    holders: dict[int, Holder],
) -> list[int]:
    """The first round trip: enqueue every leader's provisional record. A debounced or
    replacing call's followers (later calls of its key) go with the leaders, in call order,
    each leaving its arguments as it would alone: the last one's are what the run takes.
    Returns the accepted leaders; the duplicates' results are set."""
    runtime: Runtime = prepared[leaders[0]].runtime
    plain = [index for index in leaders if prepared[index].latest is None]
    leaving = [index for index in followers if prepared[index].latest is not None]
    latest = sorted([index for index in leaders if prepared[index].latest is not None] + leaving)
    outcomes: dict[int, Holder | None] = {}
    try:
        store = runtime.store  # (made on first use: a Cluster no node of which answers)
        if plain:
            calls = [prepared[index].enqueue_arguments() for index in plain]
            outcomes.update(zip(plain, store.enqueue_many(calls), strict=True))
        if latest:
            outcomes.update(
                zip(latest, store.enqueue_latest_many(_latest_calls(prepared, latest)), strict=True)
            )
    except RedisUnavailable as exc:
        for index in leaders:
            prepared[index].first_write_failed(exc)  # raises under dedupe_on_redis_error=raise
        for index in leaders:
            results[index] = prepared[index].publish_unrecorded()
        return []
    except BaseException:
        for index in [*leaders, *leaving]:
            prepared[index].withdraw_first_write()
        raise
    accepted = []
    for index in leaders:
        outcome = outcomes[index]
        duplicate = prepared[index].first_write_done(outcome)
        if duplicate is None:
            accepted.append(index)
        else:
            assert outcome is not None
            holders[index] = outcome
            results[index] = duplicate
    for index in leaving:
        if outcomes[index] is None:
            # Decided before its key's first call (a Cluster runs a redirected call again
            # after the others): its own record goes, and it answers as its first call's
            # duplicate.
            prepared[index].first_write_done(None)
            prepared[index].cancel_record()
    return accepted


def _latest_calls(prepared: list[PreparedCall], indices: list[int]) -> list[LatestCall]:
    calls = []
    for index in indices:
        call = prepared[index]
        assert call.latest is not None
        calls.append((*call.enqueue_arguments(), call.latest))
    return calls


def _publish_accepted(
    prepared: list[PreparedCall],
    accepted: list[int],
    results: list[DedupeResult | None],
    holders: dict[int, Holder],
) -> None:
    """Publish the accepted calls: on a Redis broker that is the dedup store, their pushes
    held back and sent in one round trip; elsewhere each as a single call does."""
    if not accepted:
        return
    runtime = prepared[accepted[0]].runtime
    if not runtime.one_step or any(prepared[i].path != "decide" for i in accepted):
        for position, index in enumerate(accepted):
            try:
                results[index] = prepared[index].publish_with_record()
            except BaseException:
                # The calls after it are not published: their records go too, else each
                # answers its key's calls with a task id that never runs (provisional ttl).
                for later in accepted[position + 1 :]:
                    prepared[later].cancel_after_failure()
                raise
        return
    failure = _build_messages(prepared, accepted, results)
    pushing = [i for i in accepted if prepared[i].plan.pending is not None]
    pushes = []
    for index in pushing:
        plan = prepared[index].plan
        assert plan.pending is not None
        plan.move(RecordState.SENT)  # its fate is the script's from here
        pushes.append(plan.pending)
    outcomes = dict(zip(pushing, runtime.store.publish_many(pushes), strict=True))
    for index in accepted:
        _settle(prepared[index], outcomes.get(index), index, results, holders)
    if failure is not None:
        raise failure


def _build_messages(
    prepared: list[PreparedCall], accepted: list[int], results: list[DedupeResult | None]
) -> Exception | None:
    """Publish each accepted call through Celery with its push held back (the plan keeps
    it). A call whose publish raises frees its record; the first such error is returned,
    to be raised once the others are out."""
    first = prepared[accepted[0]]
    app = first.call.app
    plans = {prepared[i].task_id: prepared[i].plan for i in accepted}
    for plan in plans.values():
        plan.deferred = True
    failure: Exception | None = None
    # One sender per publish (a batch of apply_many has one; publish_many's, any number).
    senders: dict[int, CallSender | None] = {}
    # The batch's budget runs from its first call's start (all were prepared together).
    options = [prepared[i].call.options for i in accepted]
    held = producer_block(first.call)  # (the batch's options)
    try:
        with (
            held as producer,
            within_budget(producer, app, first.shape.budget, first.deadline, options),
            first.runtime.broker.pushing_through(producer, plans),
            declaring_once(producer),
        ):
            for index in accepted:
                call = prepared[index]
                call.call.options["producer"] = producer
                key = id(call.call.publish)
                if key not in senders:
                    senders[key] = CallSender.of(
                        call.call, producer, alike=_alike(prepared, accepted, call)
                    )
                try:
                    results[index] = call.publish(senders[key])
                except Exception as exc:
                    call.cancel_record()
                    failure = failure or exc
    except Exception as exc:
        # No publish was tried (the broker could not be reached within the budget): free
        # every key the batch holds, or each would refuse the caller's retry.
        for index in accepted:
            if results[index] is None:
                prepared[index].cancel_record()
        failure = failure or exc
    return failure


def _alike(prepared: list[PreparedCall], accepted: list[int], call: PreparedCall) -> bool:
    """Are the accepted calls of ``call``'s publish prepared alike (one shape: the same
    options, apply_many's), but for their arguments?"""
    publish = call.call.publish
    return all(
        prepared[i].shape is call.shape for i in accepted if prepared[i].call.publish is publish
    )


def _settle(
    call: PreparedCall,
    outcome: Push | Holder | None,
    index: int,
    results: list[DedupeResult | None],
    holders: dict[int, Holder],
) -> None:
    """Settle one accepted call after the pushes went out."""
    if isinstance(outcome, Holder):
        # Its provisional record was lost meanwhile and another call holds the key:
        # nothing was pushed for this one.
        forget_result(call.call.app, call.task_id)
        holders[index] = outcome
        results[index] = call.duplicate(outcome)
        return
    if outcome is not None:
        call.plan.pushed(outcome)
    # (A call whose publish raised was cancelled then: it went nowhere.)
    call.settle_publish(went_out=results[index] is not None)
    if results[index] is not None:
        call.note_accepted("bulk")


def _holder_of(call: PreparedCall) -> Holder:
    """The holder a later call of the batch with the same key duplicates: this accepted
    call, queued."""
    return Holder(
        key=call.keys.call,
        task_id=call.task_id,
        state="queued",
        ttl=call.plan.ttl_ms / 1000,
        enqueued_at=call.plan.enqueued_at,
        eta=call.plan.eta,
    )
