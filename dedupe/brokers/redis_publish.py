"""The Redis broker's one-step publish: where a call's record meets its message, in
``basic_publish`` and ``_put`` on one channel instance, for one block of publishes.

On a Redis broker that is the dedup store, the record (or a place in line, or a reserved
start) and the message are written by one script in one round trip. Where one script cannot
(a fanout, queues of different expiries, a store on another server) the record is written
first and kombu pushes the message.

Design notes: docs/design-notes.md, "dedupe.brokers.redis_publish".
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager, nullcontext
from datetime import datetime, timezone
from typing import Any, TypeGuard

from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps

from dedupe.compat import kombu_private
from dedupe.compat.kombu_private import KombuMessage, RedisChannel
from dedupe.errors import RedisUnavailable
from dedupe.store.commands.pushes import PendingPush
from dedupe.store.commands.starts import EtaSplit
from dedupe.store.store import Store
from dedupe.surfaces import ProducerSurface
from dedupe.values.record import Holder
from dedupe.values.record_state import RecordState

from .declarations import all_declared
from .plans import LinePlan, PushPlan, Refused, StartPlan
from .server import ServerAddress
from .shadowing import shadowing

__all__ = ["is_redis_channel", "pushing_in_line", "pushing_through_many"]

logger = logging.getLogger("dedupe.producer")

#: A ``_put_fanout`` kombu asked for in a publish: its positional and keyword arguments.
Fanout = tuple[tuple[object, ...], dict[str, object]]


def is_redis_channel(channel: object) -> TypeGuard[RedisChannel]:
    """A channel of kombu's Redis transport (Sentinel's included)."""
    return isinstance(channel, kombu_redis.Channel)


def pushing_through_many(
    producer: ProducerSurface, plans: Mapping[str, PushPlan]
) -> ContextManager[None]:
    """:func:`pushing_through` for every publish of the block, each with the plan of its task
    id (``plans``; a message of another id goes out through kombu as it would). When every
    plan holds its push back (a batch), kombu's ``Producer.publish`` of their messages is
    spared what it would do for nothing (:class:`_HeldBack`)."""
    channel = producer.channel
    if not is_redis_channel(channel):
        return nullcontext()
    seam = _Seam(channel, plans)
    if plans and all(plan.deferred for plan in plans.values()):
        return _both(seam.installed(), _HeldBack(producer, seam).installed())
    return seam.installed()


def pushing_in_line(producer: ProducerSurface, plan: LinePlan | StartPlan) -> ContextManager[None]:
    """Publish through ``producer`` with ``plan``'s place in line (or start), for the
    duration of the block: on a Redis broker that is the dedup store, the place (or start)
    and the message in one round trip; else the place (or start) first, then the message (a
    publish that is not kombu's Redis transport's goes out as it would, and takes no place
    here)."""
    channel = producer.channel
    if not is_redis_channel(channel):
        return nullcontext()
    return _Seam(channel, {plan.task_id: plan}).installed()


@contextmanager
def _both(first: ContextManager[None], second: ContextManager[None]) -> Iterator[None]:
    with first, second:
        yield


class _Seam:
    """The channel's ``basic_publish`` and ``_put`` for a block of publishes: shadowed once for
    the block (a batch makes many publishes through it)."""

    def __init__(
        self, channel: RedisChannel, plans: Mapping[str, PushPlan | LinePlan | StartPlan]
    ) -> None:
        self.channel = channel
        self.plans = plans
        self.kombu = type(channel)
        #: The lists and fanouts kombu hands ``_put`` in the publish of a plan (None: in
        #: no such publish, ``_put`` is kombu's).
        self.queues: list[str] | None = None
        self.fanouts: list[Fanout] = []
        #: Is the dedup store on the channel's server? (per store: asked once per block)
        self.same_server: dict[int, bool] = {}

    def installed(self) -> ContextManager[None]:
        return shadowing(
            self.channel,
            basic_publish=self.basic_publish,
            **kombu_private.put_shadows(self.put, self.put_fanout),
        )

    def put(self, queue: str, message: KombuMessage, **kwargs: object) -> object:
        if self.queues is None:
            return kombu_private.put(self.channel, queue, message, **kwargs)
        self.queues.append(queue)
        return None

    def put_fanout(self, *args: object, **kwargs: object) -> object:
        if self.queues is None:
            return kombu_private.put_fanout(self.channel, *args, **kwargs)
        self.fanouts.append((args, kwargs))
        return None

    def basic_publish(
        self, message: KombuMessage, exchange: str, routing_key: str, **kwargs: object
    ) -> object:
        plan = self.plans.get(str((message.get("headers") or {}).get("id")))
        if plan is None:
            return self.kombu.basic_publish(self.channel, message, exchange, routing_key, **kwargs)
        queues: list[str] = []
        fanouts: list[Fanout] = []
        self.queues, self.fanouts = queues, fanouts
        try:
            self.kombu.basic_publish(self.channel, message, exchange, routing_key, **kwargs)
        finally:
            self.queues = None
        if isinstance(plan, LinePlan):
            _publish_in_line(self, plan, message, queues, fanouts)
            return None
        if isinstance(plan, StartPlan):
            _publish_at_start(self, plan, message, queues, fanouts)
            return None
        _publish(self, plan, message, queues, fanouts)
        return None

    def on_same_server(self, plan: PushPlan | LinePlan | StartPlan) -> bool:
        store = plan.store
        known = self.same_server.get(id(store))
        if known is None:
            known = self.same_server[id(store)] = _same_server(self.channel, store)
        return known


class _HeldBack:
    """kombu's ``Producer.publish`` on one producer instance, for a block whose planned pushes
    are all held back (a batch): a publish declares nothing its connection's declaration
    cache holds, and a planned message whose push is sure to be held back skips kombu's
    retry wrapper. Both would do nothing: ``maybe_declare`` returns on finding the entity
    in the cache (after binding two copies of it to the channel), and ``ensure`` retries
    connection errors of a publish that, held back, does no I/O (a direct route to one list
    of the store's own server: no fanout, no expiries apart, no provisional publish).

    kombu 5.7 also copies a retry policy into the connection's transport options: the
    wrapper is skipped only for a policy that a publish of the block has given kombu."""

    def __init__(self, producer: ProducerSurface, seam: _Seam) -> None:
        self.producer = producer
        self.seam = seam
        # (Bound now: the publish under it, the budget's shadow (:func:`within_budget`) or
        # kombu's.)
        self.kombu: Callable[..., object] = producer.publish
        #: The retry policies kombu was given, with retry, by a publish of the block.
        self.policies: list[object] = []

    def installed(self) -> ContextManager[None]:
        return shadowing(self.producer, publish=self.publish)

    def publish(self, body: object, *args: object, **kwargs: Any) -> object:
        declare = kwargs.get("declare")
        if declare and all_declared(self.seam.channel, declare):
            kwargs["declare"] = declare = []
        retry, policy = bool(kwargs.get("retry")) and not args, kwargs.get("retry_policy")
        if retry and policy in self.policies and not declare and self._held_back(kwargs):
            kwargs["retry"] = False
            return self.kombu(body, **kwargs)
        sent = self.kombu(body, *args, **kwargs)
        if retry and policy not in self.policies:
            self.policies.append(policy)  # (once kombu took it: not if it raised before)
        return sent

    def _held_back(self, kwargs: Mapping[str, Any]) -> bool:
        """Is the push of this publish sure to be held back, with no I/O on its way?"""
        plan = self.seam.plans.get(str((kwargs.get("headers") or {}).get("id")))
        return (
            isinstance(plan, PushPlan)
            and plan.deferred
            and kwargs.get("exchange") == ""  # a direct route: to the one list it names
            and bool(kwargs.get("routing_key"))
            and not self.producer.exchange.name  # (nor would kombu declare the producer's)
            # (kombu 5.7's Producer.batch() publishes when its block ends)
            and kombu_private.in_kombu_batch(self.producer) is False
            and self.seam.on_same_server(plan)
        )


def _publish(
    seam: _Seam,
    plan: PushPlan,
    message: KombuMessage,
    queues: list[str],
    fanouts: list[Fanout],
) -> None:
    """Write ``plan``'s record with the message kombu routed to ``queues`` (and ``fanouts``)."""
    channel = seam.channel
    if not queues and not fanouts:
        # kombu drops what no queue is bound for: nothing may hold the key for it.
        written = plan.state.provisional_written
        plan.move(RecordState.UNROUTED if written else RecordState.DROPPED)
        return
    routed = _one_step_lists(seam, plan, message, queues, fanouts)
    if routed is None:
        _publish_provisionally(channel, plan, message, queues, fanouts)
        return
    lists, expiring, expire_ms = routed
    push = PendingPush(
        plan.keys,
        plan.queued,
        plan.ttl_ms,
        dumps(message),
        lists,
        provisional=plan.provisional if plan.state.provisional_written else b"",
        expiring=expiring,
        expire_ms=expire_ms,
        force=plan.force,
        latest=plan.latest,
    )
    if plan.deferred:
        plan.pending = push
        return
    plan.move(RecordState.SENT)  # its fate is the script's from here
    outcome = plan.store.push(push)
    if isinstance(outcome, Holder):
        raise Refused(outcome)
    plan.pushed(outcome)
    return


def _one_step_lists(
    seam: _Seam,
    plan: PushPlan | LinePlan | StartPlan,
    message: KombuMessage,
    queues: list[str],
    fanouts: list[Fanout],
) -> tuple[list[str], list[str], int] | None:
    """What one script pushes ``message`` to for ``queues`` (see :func:`_lists_of`); None
    where one script cannot: a fanout, queues of different expiries, another server."""
    queue_expiry = kombu_private.queue_expiries(seam.channel)
    expiries = {queue_expiry[q] for q in queues if q in queue_expiry}
    if fanouts or len(expiries) > 1 or not seam.on_same_server(plan):
        return None
    return _lists_of(seam.channel, message, queues, expiries)


def _lists_of(
    channel: RedisChannel, message: KombuMessage, queues: list[str], expiries: set[int]
) -> tuple[list[str], list[str], int]:
    """The lists kombu would push ``message`` to for ``queues``, the lists whose expiry a
    push extends (queues declared with x-expires, every priority step), and that expiry."""
    pri = kombu_private.message_priority(channel, message)
    lists = [kombu_private.priority_list(channel, queue, pri) for queue in queues]
    expire_ms = expiries.pop() if expiries else 0
    expiring = (
        [
            kombu_private.priority_list(channel, q, step)
            for q in queues
            for step in kombu_private.priority_steps(channel)
        ]
        if expire_ms
        else []
    )
    return lists, expiring, expire_ms


def _publish_in_line(
    seam: _Seam,
    plan: LinePlan,
    message: KombuMessage,
    queues: list[str],
    fanouts: list[Fanout],
) -> None:
    """Take ``plan``'s place in line with the message kombu routed to ``queues``."""
    channel = seam.channel
    if not queues and not fanouts:
        # kombu drops what no queue is bound for: a place would hold the line for nothing.
        plan.state = "dropped"
        return
    routed = _one_step_lists(seam, plan, message, queues, fanouts)
    if routed is None:
        _place_then_push(channel, plan, message, queues, fanouts)
        return
    lists, expiring, expire_ms = routed
    plan.state = "sent"  # its fate is the script's from here: never left on a failure
    if plan.limit:
        # Handed a free slot and pushed, or held in line with its message (no place apart).
        plan.ahead = plan.store.hold_or_push(
            plan.keys,
            plan.task_id,
            lease_ms=plan.lease_ms,
            limit=plan.limit,
            ttl_ms=plan.ttl_ms,
            message=dumps(message),
            lists=lists,
            expiring=expiring,
            expire_ms=expire_ms,
        )
        plan.state = "pushed"
        return
    plan.store.take_ticket_and_push(
        plan.keys,
        plan.task_id,
        plan.ttl_ms,
        dumps(message),
        lists,
        expiring=expiring,
        expire_ms=expire_ms,
    )
    plan.state = "pushed"


def _publish_at_start(
    seam: _Seam,
    plan: StartPlan,
    message: KombuMessage,
    queues: list[str],
    fanouts: list[Fanout],
) -> None:
    """Reserve ``plan``'s start (and take its place in line) with the message kombu routed
    to ``queues``, its eta the start's: the script decides the countdown, so the message is
    serialised around its eta and the script writes it."""
    channel = seam.channel
    if not queues and not fanouts:
        plan.state = "dropped"  # (kombu drops it: no start, no place, for nothing)
        return
    headers = message["headers"]  # (protocol 2's, eta included: see publish_limited)
    routed = _one_step_lists(seam, plan, message, queues, fanouts)
    split = None if routed is None else _split_at_eta(message, headers)
    if routed is None or split is None:
        _start_then_push(channel, plan, message, queues, fanouts)
        return
    lists, expiring, expire_ms = routed
    plan.state = "sent"  # its fate is the script's from here: never left on a failure
    pushed = plan.store.reserve_start_and_push(
        plan.keys,
        plan.task_id,
        plan.count,
        plan.period_ms,
        split,
        lists,
        earliest_ms=plan.earliest_ms,
        expiring=expiring,
        expire_ms=expire_ms,
        place=plan.place,
    )
    plan.state = "pushed"
    # Celery hands this dict to after_task_publish: its receivers see the eta that was pushed
    # (the task-sent event was made before, with the call's own).
    headers["eta"] = json.loads(pushed.eta)


def _split_at_eta(message: KombuMessage, headers: dict[str, object]) -> EtaSplit | None:
    """``message`` serialised as kombu pushes it, split at its eta's JSON value (None: the
    placeholder is not found once)."""
    own = headers["eta"]
    placeholder = f"dedupe-eta-{uuid.uuid4().hex}"
    headers["eta"] = placeholder
    try:
        text = dumps(message)
    finally:
        headers["eta"] = own
    parts = text.split(json.dumps(placeholder))
    if len(parts) != 2:
        return None
    return EtaSplit(parts[0], dumps(own), parts[1])


def _start_then_push(
    channel: RedisChannel,
    plan: StartPlan,
    message: KombuMessage,
    queues: list[str],
    fanouts: list[Fanout],
) -> None:
    """Two steps, as on any other broker: the start (and the place), then kombu's push, the
    eta written here."""
    logger.debug("%s: no one-step publish here, reserving its start first", plan.task_id)
    delay_ms = plan.reserve_apart()
    if delay_ms != plan.earliest_ms:
        at = datetime.fromtimestamp(time.time() + delay_ms / 1000, timezone.utc)
        message["headers"]["eta"] = at.isoformat()  # (protocol 2: see publish_limited)
    _push_as_kombu(channel, plan, message, queues, fanouts)


def _place_then_push(
    channel: RedisChannel,
    plan: LinePlan,
    message: KombuMessage,
    queues: list[str],
    fanouts: list[Fanout],
) -> None:
    if not plan.limit:  # (key_concurrency alone: no place apart, its run takes its turn)
        logger.debug("%s: no one-step publish here, taking its place first", plan.task_id)
        plan.take_place_apart()
    _push_as_kombu(channel, plan, message, queues, fanouts)


def _push_as_kombu(
    channel: RedisChannel,
    plan: LinePlan | StartPlan,
    message: KombuMessage,
    queues: list[str],
    fanouts: list[Fanout],
) -> None:
    """kombu's own push of a message whose place (or start) was taken apart from it: a
    place taken is the message's once it is pushed (a failed push leaves the line)."""
    for queue in queues:
        kombu_private.put(channel, queue, message)
    for args, kwargs in fanouts:
        kombu_private.put_fanout(channel, *args, **kwargs)
    if plan.state == "placed":
        plan.state = "pushed"


def _publish_provisionally(
    channel: RedisChannel,
    plan: PushPlan,
    message: KombuMessage,
    queues: list[str],
    fanouts: list[Fanout],
) -> None:
    logger.debug("%s: no one-step publish here, publishing provisionally", plan.task_id)
    if not plan.state.provisional_written:
        try:
            store, keys, ttl_ms = plan.store, plan.keys, plan.provisional_ttl_ms
            holder = (
                store.enqueue(keys, plan.provisional, ttl_ms)
                if plan.latest is None
                else store.enqueue_latest(keys, plan.provisional, ttl_ms, plan.latest)
            )
        except RedisUnavailable:
            raise
        except BaseException:
            plan.move(RecordState.ASKED)  # (the publish's failure withdraws it)
            raise
        if holder is not None and not plan.force:
            raise Refused(holder)
        if holder is None:
            plan.move(RecordState.PROVISIONAL)
    for queue in queues:
        kombu_private.put(channel, queue, message)
    for args, kwargs in fanouts:
        kombu_private.put_fanout(channel, *args, **kwargs)
    if plan.state is RecordState.PROVISIONAL:
        plan.move(RecordState.AWAITING_CONFIRM)


def _same_server(channel: RedisChannel, store: Store) -> bool:
    """Is the channel's Redis the dedup store's server and database?"""
    server = store.server
    return server is not None and ServerAddress.of_client(server) == ServerAddress.of_client(
        channel.pool.connection_kwargs
    )
