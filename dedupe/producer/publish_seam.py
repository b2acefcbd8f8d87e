"""Where a call's record meets its message: ``basic_publish``, on one channel instance, for
one publish.

Two uses. On a Redis broker that is the dedup store (:func:`pushing_through`), the record and
the message are written in one round trip. On any other broker (:func:`deciding_at_push`),
the provisional record's ``enqueue`` is sent before Celery builds the message and its answer
read only at the push: Redis decides while Celery and kombu do their CPU work. And where the
call budget holds at the broker (:func:`within_budget`).

One round trip, on a Redis broker
---------------------------------

Design notes: docs/design-notes.md, "dedupe.producer.publish_seam".
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from kombu.exceptions import OperationalError
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps

from dedupe.compat import kombu_private
from dedupe.errors import RedisUnavailable
from dedupe.store.commands.pushes import PendingPush
from dedupe.store.commands.starts import EtaSplit, PlaceWait
from dedupe.store.connections import Reply
from dedupe.store.replies import Push
from dedupe.store.store import Store
from dedupe.values.config import SettingReader
from dedupe.values.keys import CallKeys
from dedupe.values.latest import LatestWrite
from dedupe.values.record import Holder, pack_provisional, pack_queued

from .record_state import RecordState

__all__ = [
    "BrokerBudget",
    "LinePlan",
    "PendingDecision",
    "PushPlan",
    "Refused",
    "StartPlan",
    "deciding_at_push",
    "is_redis_channel",
    "pushing_in_line",
    "pushing_through",
    "pushing_through_many",
    "within_budget",
]

logger = logging.getLogger("dedupe.producer")


class Refused(Exception):
    """The dedup script refused a publish: the call's key is held. Nothing was pushed."""

    def __init__(self, holder: Holder) -> None:
        super().__init__(holder.task_id)
        self.holder = holder


@dataclass(eq=False)
class PushPlan:
    """What one publish must write with its message, and what became of it."""

    #: The dedup store, asked for when first needed (the runtime makes it then: a Cluster
    #: no node of which answers makes none, and the call's first write says so).
    store_of: Callable[[], Store]
    keys: CallKeys
    task_id: str
    #: The call's nonce, and the fields of its queued record.
    nonce: int
    enqueued_at: float
    eta: float | None
    #: Time to live of the queued record, and of the provisional one, ms.
    ttl_ms: int
    provisional_ttl_ms: int
    #: Push even when the key is held: canvas members and continuations are never refused.
    force: bool = False
    #: What the call's record is in Redis (moved only through :meth:`RecordState.to`).
    state: RecordState = RecordState.ABSENT
    #: Hold the push back (a batch sends all of its pushes in one round trip): the seam
    #: leaves it in :attr:`pending` instead of sending it.
    deferred: bool = False
    pending: PendingPush | None = None
    #: A debounced or replacing call's: what it leaves for the holder's run as a duplicate.
    latest: LatestWrite | None = None

    @property
    def store(self) -> Store:
        return self.store_of()

    def move(self, state: RecordState) -> None:
        """The record is now ``state``."""
        self.state = self.state.to(state)

    def pushed(self, outcome: Push | Holder) -> None:
        """publish.lua answered (a Holder: refused, nothing pushed)."""
        if not isinstance(outcome, Holder):
            self.move(RecordState.QUEUED)

    # Packed on first use (a duplicate needs the provisional record only, and only a publish
    # needs the queued one); plain attributes, not functools.cached_property, which takes a
    # lock on every read before Python 3.12.
    _provisional: bytes | None = None
    _queued: bytes | None = None

    @property
    def provisional(self) -> bytes:
        """This call's provisional record."""
        if self._provisional is None:
            self._provisional = pack_provisional(self.task_id, self.nonce)
        return self._provisional

    @property
    def queued(self) -> bytes:
        """This call's queued record."""
        if self._queued is None:
            self._queued = pack_queued(self.task_id, self.enqueued_at, self.eta, self.nonce)
        return self._queued


@dataclass(eq=False)
class LinePlan:
    """What the publish of a call with ``key_concurrency`` writes with its message: its
    place in its key's line (ticket.lua), and what became of it."""

    store_of: Callable[[], Store]
    #: The key's line, due and seq keys (:class:`~dedupe.values.limits.LimitHeader`'s).
    keys: Mapping[str, str]
    task_id: str
    #: How long the place waits for its message's first run, ms.
    ttl_ms: int
    #: Called when a place taken apart from the push cannot be had (Redis unreachable):
    #: raises to refuse the publish, or returns to publish without the place.
    unavailable: Callable[[RedisUnavailable], None]
    #: absent: nothing written; sent: ticket_publish.lua was sent (the place and the message
    #: both, or neither); placed: the place taken apart, its message not pushed yet; pushed:
    #: the place and its message; dropped: routed nowhere, so no place either.
    state: Literal["absent", "sent", "placed", "pushed", "dropped"] = "absent"

    @property
    def store(self) -> Store:
        return self.store_of()

    @property
    def owns_a_place_alone(self) -> bool:
        """Is a place of this call's in line with no message known to go with it? (A failed
        publish must free it, or it holds the calls behind it until it lapses.)"""
        return self.state == "placed"


@dataclass(eq=False)
class StartPlan:
    """What the publish of a call with ``key_rate_limit`` writes with its message: its
    reserved start (start.lua's "call"), and its place in line with both limits; the
    message's eta is its start's, when that is later than the call's own."""

    store_of: Callable[[], Store]
    #: The key's starts and plan keys (line, due and seq too, with both limits).
    keys: Mapping[str, str]
    task_id: str
    #: N starts per period (ms).
    count: int
    period_ms: int
    #: The call's own countdown or eta, ms from now (0: none).
    earliest_ms: int
    #: Called when a start or place taken apart from the push cannot be had (Redis
    #: unreachable): raises to refuse the publish, or returns to publish without them.
    unavailable: Callable[[RedisUnavailable], None]
    #: Both limits: how long its place in line waits (None: no place, a rate alone).
    place: PlaceWait | None = None
    #: As :class:`LinePlan`'s (a start alone is never "placed": a reserved start lapses).
    state: Literal["absent", "sent", "placed", "pushed", "dropped"] = "absent"

    @property
    def store(self) -> Store:
        return self.store_of()

    @property
    def owns_a_place_alone(self) -> bool:
        """As :attr:`LinePlan.owns_a_place_alone`."""
        return self.state == "placed"


def is_redis_channel(channel: Any) -> bool:
    """A channel of kombu's Redis transport (Sentinel's included)."""
    return isinstance(channel, kombu_redis.Channel)


@contextmanager
def _shadowing(channel: Any, **methods: Callable[..., Any]) -> Iterator[None]:
    """Shadow methods on this one channel instance for the block; what the instance had before
    is back after it (kombu's channels are shared by no other thread while a producer holds
    them). py-amqp puts ``basic_publish_confirm`` on the instance under confirm_publish: a
    shadow that merely dropped its own attribute would turn publisher confirms off."""
    missing = object()
    saved = {name: channel.__dict__.get(name, missing) for name in methods}
    channel.__dict__.update(methods)
    try:
        yield
    finally:
        for name, before in saved.items():
            if before is missing:
                channel.__dict__.pop(name, None)
            else:
                channel.__dict__[name] = before


def pushing_through(producer: Any, plan: PushPlan) -> ContextManager[None]:
    """Publish through ``producer`` with ``plan``'s record, for the duration of the block."""
    return pushing_through_many(producer, {plan.task_id: plan})


def pushing_through_many(producer: Any, plans: Mapping[str, PushPlan]) -> ContextManager[None]:
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


def pushing_in_line(producer: Any, plan: LinePlan | StartPlan) -> ContextManager[None]:
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

    def __init__(self, channel: Any, plans: Mapping[str, PushPlan | LinePlan | StartPlan]) -> None:
        self.channel = channel
        self.plans = plans
        self.kombu = type(channel)
        #: The lists and fanouts kombu hands ``_put`` in the publish of a plan (None: in
        #: no such publish, ``_put`` is kombu's).
        self.queues: list[str] | None = None
        self.fanouts: list[tuple[Any, ...]] = []
        #: Is the dedup store on the channel's server? (per store: asked once per block)
        self.same_server: dict[int, bool] = {}

    def installed(self) -> ContextManager[None]:
        return _shadowing(
            self.channel,
            basic_publish=self.basic_publish,
            **kombu_private.put_shadows(self.put, self.put_fanout),
        )

    def put(self, queue: str, message: Any, **kwargs: Any) -> Any:
        if self.queues is None:
            return kombu_private.put(self.channel, queue, message, **kwargs)
        self.queues.append(queue)
        return None

    def put_fanout(self, *args: Any, **kwargs: Any) -> Any:
        if self.queues is None:
            return kombu_private.put_fanout(self.channel, *args, **kwargs)
        self.fanouts.append((args, kwargs))
        return None

    def basic_publish(
        self, message: dict[str, Any], exchange: str, routing_key: str, **kwargs: Any
    ) -> Any:
        plan = self.plans.get(str((message.get("headers") or {}).get("id")))
        if plan is None:
            return self.kombu.basic_publish(self.channel, message, exchange, routing_key, **kwargs)
        queues: list[str] = []
        fanouts: list[tuple[Any, ...]] = []
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
        return _publish(self, plan, message, queues, fanouts)

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

    def __init__(self, producer: Any, seam: _Seam) -> None:
        self.producer = producer
        self.seam = seam
        # (Bound now: the publish under it, the budget's shadow (:func:`within_budget`) or
        # kombu's.)
        self.kombu = producer.publish
        #: The retry policies kombu was given, with retry, by a publish of the block.
        self.policies: list[Any] = []

    def installed(self) -> ContextManager[None]:
        return _shadowing(self.producer, publish=self.publish)

    def publish(self, body: Any, *args: Any, **kwargs: Any) -> Any:
        declare = kwargs.get("declare")
        if declare and _all_declared(self.seam.channel, declare):
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


def declaring_once(producer: Any) -> ContextManager[None]:
    """kombu's ``Producer.maybe_declare`` on ``producer`` for the block, with the look in its
    connection's declaration cache made first.

    kombu binds an unbound entity (the queue Celery routes a call to) to the channel before
    that look, and binding copies it: about a tenth of a publish to RabbitMQ, every call, for
    a queue declared at the connection's first publish. The look is kombu's own, made on
    each try of the publish (a reconnect's empty cache declares again); an entity not found
    goes to kombu. ``before_task_publish`` still sees Celery's ``declare``."""
    kombu_maybe_declare = type(producer).maybe_declare

    def maybe_declare(entity: Any, retry: bool = False, **retry_policy: Any) -> Any:
        if entity and _declared(producer.channel, entity):
            return False  # (what kombu's maybe_declare returns for a cached declaration)
        return kombu_maybe_declare(producer, entity, retry, **retry_policy)

    return _shadowing(producer, maybe_declare=maybe_declare)


def _declared(channel: Any, entity: Any) -> bool:
    """Would kombu's ``maybe_declare`` find ``entity`` declared on ``channel``'s connection?"""
    connection = getattr(channel, "connection", None)
    if connection is None or not getattr(entity, "can_cache_declaration", False):
        return False  # (a closed channel: kombu revives the entity and declares it again)
    return hash(entity) in connection.client.declared_entities


def _all_declared(channel: Any, entities: Any) -> bool:
    """Would kombu's ``maybe_declare`` find each of ``entities`` declared, and return?"""
    return all(_declared(channel, entity) for entity in entities)


def _publish(
    seam: _Seam,
    plan: PushPlan,
    message: dict[str, Any],
    queues: list[str],
    fanouts: list[tuple[Any, ...]],
) -> Any:
    """Write ``plan``'s record with the message kombu routed to ``queues`` (and ``fanouts``)."""
    channel = seam.channel
    if not queues and not fanouts:
        # kombu drops what no queue is bound for: nothing may hold the key for it.
        written = plan.state.provisional_written
        plan.move(RecordState.UNROUTED if written else RecordState.DROPPED)
        return None
    routed = _one_step_lists(seam, plan, message, queues, fanouts)
    if routed is None:
        _publish_provisionally(channel, plan, message, queues, fanouts)
        return None
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
        return None
    plan.move(RecordState.SENT)  # its fate is the script's from here
    outcome = plan.store.push(push)
    if isinstance(outcome, Holder):
        raise Refused(outcome)
    plan.pushed(outcome)
    return None


def _one_step_lists(
    seam: _Seam,
    plan: PushPlan | LinePlan | StartPlan,
    message: dict[str, Any],
    queues: list[str],
    fanouts: list[tuple[Any, ...]],
) -> tuple[list[str], list[str], int] | None:
    """What one script pushes ``message`` to for ``queues`` (see :func:`_lists_of`); None
    where one script cannot: a fanout, queues of different expiries, another server."""
    queue_expiry = kombu_private.queue_expiries(seam.channel)
    expiries = {queue_expiry[q] for q in queues if q in queue_expiry}
    if fanouts or len(expiries) > 1 or not seam.on_same_server(plan):
        return None
    return _lists_of(seam.channel, message, queues, expiries)


def _lists_of(
    channel: Any, message: dict[str, Any], queues: list[str], expiries: set[int]
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
    message: dict[str, Any],
    queues: list[str],
    fanouts: list[tuple[Any, ...]],
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
    message: dict[str, Any],
    queues: list[str],
    fanouts: list[tuple[Any, ...]],
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


def _split_at_eta(message: dict[str, Any], headers: dict[str, Any]) -> EtaSplit | None:
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
    channel: Any,
    plan: StartPlan,
    message: dict[str, Any],
    queues: list[str],
    fanouts: list[tuple[Any, ...]],
) -> None:
    """Two steps, as on any other broker: the start (and the place), then kombu's push, the
    eta written here."""
    logger.debug("%s: no one-step publish here, reserving its start first", plan.task_id)
    store, keys, task_id = plan.store, plan.keys, plan.task_id
    try:
        wait_ms = store.next_start(
            keys, task_id, plan.count, plan.period_ms, earliest_ms=plan.earliest_ms
        )
    except RedisUnavailable as exc:
        plan.unavailable(exc)
        wait_ms = 0
    delay_ms = plan.earliest_ms
    if wait_ms > max(delay_ms, 1):
        delay_ms = wait_ms
        at = datetime.fromtimestamp(time.time() + wait_ms / 1000, timezone.utc)
        message["headers"]["eta"] = at.isoformat()  # (protocol 2: see publish_limited)
    if plan.place is not None:
        try:
            store.take_ticket(keys, task_id, plan.place.ms_after(delay_ms))
            plan.state = "placed"
        except RedisUnavailable as exc:
            plan.unavailable(exc)
    _push_as_kombu(channel, plan, message, queues, fanouts)


def _place_then_push(
    channel: Any,
    plan: LinePlan,
    message: dict[str, Any],
    queues: list[str],
    fanouts: list[tuple[Any, ...]],
) -> None:
    logger.debug("%s: no one-step publish here, taking its place first", plan.task_id)
    try:
        plan.store.take_ticket(plan.keys, plan.task_id, plan.ttl_ms)
        plan.state = "placed"
    except RedisUnavailable as exc:
        plan.unavailable(exc)
    _push_as_kombu(channel, plan, message, queues, fanouts)


def _push_as_kombu(
    channel: Any,
    plan: LinePlan | StartPlan,
    message: dict[str, Any],
    queues: list[str],
    fanouts: list[tuple[Any, ...]],
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
    channel: Any,
    plan: PushPlan,
    message: dict[str, Any],
    queues: list[str],
    fanouts: list[tuple[Any, ...]],
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


def _same_server(channel: Any, store: Store) -> bool:
    """Is the channel's Redis the dedup store's server and database? (Spelled alike: a
    broker at ``localhost`` and a store at ``127.0.0.1`` count as two.)"""
    server = store.server
    return server is not None and _address(channel.pool.connection_kwargs) == _address(server)


def _address(kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        kwargs.get("path"),
        kwargs.get("host"),
        int(kwargs.get("port") or 6379),
        int(kwargs.get("db") or 0),
    )


@dataclass(eq=False)
class PendingDecision:
    """An ``enqueue`` sent and not yet read: the verdict on a provisional record."""

    store: Store
    keys: CallKeys
    reply: Reply
    #: The provisional record the enqueue was sent with, and its ttl (sent again after a
    #: restore: see :class:`~dedupe.store.store.DataLossBarrier`).
    record: bytes
    ttl_ms: int
    #: Called when the answer cannot be had (Redis unreachable): raises to refuse the
    #: publish, or returns to publish without dedup.
    unavailable: Callable[[RedisUnavailable], None]
    #: Its read began (once: a failed read is not tried again).
    decided: bool = False
    #: Its read ended: with the verdict, or Redis unavailable (not cut short by an exception).
    read: bool = False
    holder: Holder | None = None

    def decide(self) -> Holder | None:
        """The holder that makes the call a duplicate, or None (read once)."""
        if not self.decided:
            self.decided = True
            try:
                self.holder = self.store.enqueue_result(
                    self.keys, self.reply, self.record, self.ttl_ms
                )
            except RedisUnavailable as exc:
                self.read = True
                self.unavailable(exc)
            self.read = True
        return self.holder


def deciding_at_push(producer: Any, decision: PendingDecision) -> ContextManager[None]:
    """Read ``decision`` at the push of the publish made in the block, on any transport: a
    duplicate unwinds as :class:`Refused` before the message reaches the broker."""
    transport_publish = producer.channel.basic_publish  # the transport's, confirm mode included

    def basic_publish(message: Any, *args: Any, **kwargs: Any) -> Any:
        holder = decision.decide()
        if holder is not None:
            raise Refused(holder)
        return transport_publish(message, *args, **kwargs)

    return _shadowing(producer.channel, basic_publish=basic_publish)


# -- the call budget at the broker -----------------------------------------------------------

_publish_retry = SettingReader("task_publish_retry")
_publish_retry_policy = SettingReader("task_publish_retry_policy")
#: What kombu's connection retries take from a retry policy or from transport options.
_RETRY_KEYS = ("max_retries", "interval_start", "interval_step", "interval_max")
_ABSENT = object()


class BrokerBudget:
    """kombu's ``errback`` for the connection retries of a publish: gives up with kombu's
    ``OperationalError`` (what a plain call raises when its retry policy runs out) before a
    wait would take the call past its deadline; the retry policy's own errback is called
    first. Enforced only in the call's thread and until its publish is over: kombu 5.7
    copies a retry policy into the transport options its pooled connections share, where
    another publish's retries may find it."""

    def __init__(self, connection: Any, budget: float, deadline: float) -> None:
        self._connection = connection
        self._budget = budget
        self._deadline = deadline
        self._thread = threading.get_ident()
        self.active = True
        #: The errback of the retry policy of the publish under way, called first.
        self.then: Callable[..., Any] | None = None

    def __call__(self, exc: BaseException, interval: float) -> Any:
        answer = self.then(exc, interval) if self.then is not None else None
        if (
            self.active
            and threading.get_ident() == self._thread
            and time.monotonic() + interval > self._deadline
        ):
            raise OperationalError(self.message(exc)) from exc
        return answer

    def message(self, exc: BaseException) -> str:
        broker = self._connection.as_uri()  # (the password masked)
        return (
            f"the broker at {broker} did not answer within the call budget "
            f"(dedupe_call_budget={self._budget} s): {type(exc).__name__}: {exc}. Start the "
            f"broker or make it reachable; to wait longer, raise dedupe_call_budget (0: the "
            f"retry policy alone, task_publish_retry_policy)"
        )


def within_budget(
    producer: Any,
    app: Any,
    budget: float,
    deadline: float | None,
    calls_options: Sequence[dict[str, Any]],
) -> ContextManager[None]:
    """Publish the calls of ``calls_options`` through ``producer`` in the block, waiting on
    the broker until ``deadline`` (``time.monotonic()``; None: no budget) at most.

    Connects first, if the producer never did, with the retries the publish would make (the
    call's retry policy, as kombu 5.7 reconnects with it): the seams ask for the producer's
    channel before kombu's publish, and kombu opens one outside its retry with its connect
    timeout (``broker_connection_timeout``: 4 s, 6 s by its retry intervals). Then kombu's
    own retries of each publish, through the errback of its ``retry_policy``."""
    return _WithinBudget(producer, app, budget, deadline, calls_options)


class _WithinBudget:
    """:func:`within_budget`'s block (a class: a generator-based one costs every call more).

    The errback goes into the retry policy of each publish of the block through a shadow of
    the producer's ``publish``, not into the calls' options: ``before_task_publish``
    receivers get the retry policy a plain call gives them."""

    __slots__ = (
        "_app",
        "_before",
        "_calls_options",
        "_connection",
        "_errback",
        "_installed",
        "_producer",
        "_shadowed",
    )

    def __init__(
        self,
        producer: Any,
        app: Any,
        budget: float,
        deadline: float | None,
        calls_options: Sequence[dict[str, Any]],
    ) -> None:
        self._producer = producer
        self._app = app
        self._calls_options = calls_options
        connection = self._connection = producer.connection
        self._errback = (
            BrokerBudget(connection, budget, deadline)
            if deadline is not None and connection is not None
            else None
        )
        self._before: Any = _ABSENT
        self._installed = False
        #: What the producer instance had as its ``publish`` before the shadow (_ABSENT: none).
        self._shadowed: Any = _ABSENT

    def __enter__(self) -> None:
        connection, errback = self._connection, self._errback
        if connection is None:
            return
        if errback is not None:
            self._before = connection.transport_options.get("errback", _ABSENT)
        if not connection.connected:
            try:
                _connect(connection, self._app, self._calls_options, errback)
            except BaseException:
                self._done()
                raise
        if errback is not None:
            producer = self._producer
            self._shadowed = producer.__dict__.get("publish", _ABSENT)
            producer.__dict__["publish"] = _publishing(producer.publish, errback)
            self._installed = True

    def __exit__(self, *_: object) -> None:
        self._done()

    def _done(self) -> None:
        errback = self._errback
        if errback is None:
            return
        errback.active = False
        if self._installed:
            producer = self._producer
            if self._shadowed is _ABSENT:
                producer.__dict__.pop("publish", None)
            else:
                producer.__dict__["publish"] = self._shadowed
        options = self._connection.transport_options
        if options.get("errback") is errback:  # (kombu 5.7 copied it there)
            if self._before is _ABSENT:
                options.pop("errback", None)
            else:
                options["errback"] = self._before


def _publishing(publish: Callable[..., Any], errback: BrokerBudget) -> Callable[..., Any]:
    """``publish`` (a producer's) with ``errback`` in the retry policy of a retried publish."""

    def publish_within_budget(body: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("retry") and not args:
            policy = kwargs.get("retry_policy") or {}
            errback.then = policy.get("errback")
            kwargs["retry_policy"] = {**policy, "errback": errback}
        return publish(body, *args, **kwargs)

    return publish_within_budget


def _connect(
    connection: Any, app: Any, calls_options: Sequence[dict[str, Any]], errback: Any
) -> None:
    """Connect as kombu's publish would: with the retries of the call's policy (kombu 5.7
    copies it into the transport options its channel connects with), else of the transport
    options; within ``errback``'s budget."""
    first = calls_options[0] if calls_options else {}
    retry = first.get("retry")
    if retry is None:
        retry = _publish_retry(app)
    transport_options = connection.transport_options or {}
    retries = {key: transport_options[key] for key in _RETRY_KEYS if key in transport_options}
    own = transport_options.get("errback")
    if retry:
        policy = {**(_publish_retry_policy(app) or {}), **(first.get("retry_policy") or {})}
        retries.update((key, policy[key]) for key in _RETRY_KEYS if key in policy)
        own = policy.get("errback")
    if isinstance(own, BrokerBudget):
        own = None  # (another call's, left by kombu)
    if isinstance(errback, BrokerBudget):
        errback.then = own
    else:
        errback = own
    timeout = transport_options.get("connect_retries_timeout", connection.connect_timeout)
    connection.ensure_connection(errback=errback, timeout=timeout, **retries)
