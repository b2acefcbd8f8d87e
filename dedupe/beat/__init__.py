"""Deduplicating beat schedulers: a periodic task is not sent while its previous run is still
queued or running, and any number of beat processes side by side send each tick of an entry
once (the first to claim the tick sends it; see ``dedupe.beat.ticks``).

Switch schedulers with one flag:

```console
celery -A proj beat -S dedupe.beat:DedupeScheduler                         # PersistentScheduler
celery -A proj beat -S dedupe.beat.database:DedupeDatabaseScheduler       # django-celery-beat
celery -A proj beat -S dedupe.beat.redbeat:DedupeRedBeatScheduler         # celery-redbeat
```

or compose the mixin (``DedupeSchedulerMixin``) with any other scheduler, first in the bases.
More, with examples: the docs' API reference, dedupe.beat.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import sys
import traceback
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery.beat import PersistentScheduler, Scheduler, SchedulingError
from celery.exceptions import reraise
from celery.utils.log import get_logger

from dedupe.brokers.publish_watch import PublishWatch
from dedupe.compat.celery_private import count_beat_send
from dedupe.errors import DedupeError, RedisUnavailable
from dedupe.events import UNAVAILABLE, emit
from dedupe.producer.broker_budget import within_budget
from dedupe.producer.guard import Call, publish_unique, publisher_for
from dedupe.producer.limited_publish import publish_limited
from dedupe.runs.runtime import installed
from dedupe.values.header import HEADER
from dedupe.values.keys import tick_key
from dedupe.values.options import pop_call_options
from dedupe.values.record import HOST

from .ticks import tick_of

if TYPE_CHECKING:
    from dedupe.store.store import Store

    _SchedulerBase = Scheduler
else:
    _SchedulerBase = object

__all__ = ["OPTIONS_HEADER", "DedupeScheduler", "DedupeSchedulerMixin", "entry_options"]

#: An entry header whose mapping is read as dedup options: for schedulers whose entries
#: carry only a fixed set of options but any headers (django-celery-beat's PeriodicTask).
OPTIONS_HEADER = "dedupe"

logger = logging.getLogger("dedupe.beat")
# Celery's beat logger: a sent tick's "Sending due task" line stays where Celery puts it.
celery_beat_logger = get_logger("celery.beat")

# Celery's own helpers for callable entry arguments (private, present since Celery 4).
try:
    from celery.beat import (  # type: ignore[attr-defined]
        _evaluate_entry_args,
        _evaluate_entry_kwargs,
    )
except ImportError:  # pragma: no cover - older or newer Celery

    def _evaluate_entry_args(entry_args: Any) -> Any:
        return entry_args or []

    def _evaluate_entry_kwargs(entry_kwargs: Any) -> Any:
        return entry_kwargs or {}


class DedupeSchedulerMixin(_SchedulerBase):
    """Sends an entry only when its previous run is neither queued nor running.

    Every scheduler sends through ``apply_async(entry, producer, advance)``: this mixin
    replaces that step (keeping the scheduler's own ``reserve`` and sync), so it composes
    with the default scheduler, django-celery-beat and RedBeat alike, and covers task names
    the beat process does not import (the ``send_task`` path). Celery's "Sending due task"
    line is logged for a tick sent; a tick skipped logs why ("beat: not sending ...").
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: Sends skipped per entry name because the previous run was still live.
        self.dedupe_skipped: Counter[str] = Counter()
        #: Sends skipped per entry name because another beat sent that tick.
        self.dedupe_ticks_skipped: Counter[str] = Counter()
        # Names this scheduler in its tick claims (two may share a process, or a pid); each
        # claim adds its own number, so a claim's resend is told from an earlier send.
        self._claimant = f"{HOST}:{os.getpid()}:{secrets.token_hex(4)}#".encode()
        self._claims = itertools.count(1)
        super().__init__(*args, **kwargs)

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        """Celery's ``apply_entry``, but Celery's "Sending due task" line is logged once the
        tick is sent, and only then: a tick skipped logs the "not sending" line alone."""
        self._apply_due(entry, advance=False, producer=producer)

    def _apply_due(self, entry: Any, advance: bool, **kwargs: Any) -> None:
        # Celery logs "Sending due task" before apply_async decides: for a skipped tick
        # that line would contradict the "not sending" one that follows it.
        try:
            result = self.apply_async(entry, advance=advance, **kwargs)
        except Exception as exc:
            celery_beat_logger.error(
                "Message Error: %s\n%s", exc, traceback.format_stack(), exc_info=True
            )
            return
        if result is None or getattr(result, "deduplicated", False):
            return  # (said by apply_async, with the reason)
        celery_beat_logger.info("Scheduler: Sending due task %s (%s)", entry.name, entry.task)
        celery_beat_logger.debug("%s sent. id->%s", entry.task, getattr(result, "id", None))

    def apply_async(
        self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        entry = self.reserve(entry) if advance else entry
        name, task_name = str(entry.name), str(entry.task)
        task = self.app.tasks.get(task_name)
        claimed: tuple[str, bytes] | None = None
        watch: PublishWatch | None = None
        try:
            send, claimed = self._claim_tick(entry, name, task_name)
            if not send:
                return None
            unique, options = entry_options(entry)
            args = _evaluate_entry_args(entry.args)
            call_kwargs = _evaluate_entry_kwargs(entry.kwargs)
            with self.app.producer_or_acquire(producer) as producer:
                options["producer"] = producer
                # Connected first as the publish would connect: the watch asks for the channel.
                with (
                    within_budget(producer, self.app, 0.0, None, [options]),
                    PublishWatch(producer) as watch,
                ):
                    result = self._send(task, task_name, args, call_kwargs, options, unique)
        except Exception as exc:
            if claimed is not None:
                if watch is not None and watch.may_be_out(exc):
                    # Its message may be out: a second beat's send would be a second message.
                    logger.warning(
                        "beat: %s's send failed once the broker had its message: its tick "
                        "claim %s stays, and no other beat sends that tick",
                        task_name,
                        claimed[0],
                    )
                else:
                    self._give_up_tick(*claimed, task_name)
            reraise(
                SchedulingError,
                SchedulingError(f"Couldn't apply scheduled task {name}: {exc}"),
                sys.exc_info()[2],
            )
        finally:
            self._count_send()
        if getattr(result, "deduplicated", False):
            self.dedupe_skipped[name] += 1
            holder = getattr(result, "holder", None)
            logger.info(
                "beat: not sending %s (%s): its previous run %s is still %s (skipped %s)",
                name,
                task_name,
                result.id,
                holder.state if holder else "live",
                _times(self.dedupe_skipped[name]),
            )
        return result

    def _send(
        self,
        task: Any,
        task_name: str,
        args: Any,
        call_kwargs: Any,
        options: dict[str, Any],
        unique: bool,
    ) -> Any:
        """Publish a tick's call: a limited task's waits its turn, a unique one's is skipped
        while its key is held, any other is sent as Celery sends it."""
        publish = publisher_for(task, task_name, self.app, send_task=self.send_task)
        if _limited(task):
            # Every tick is accepted and waits its turn (key_concurrency, key_rate_limit).
            pop_call_options(options)
            return publish_limited(
                Call(self.app, task, task_name, args, call_kwargs, options, publish)
            )
        if not unique:
            pop_call_options(options)
            return publish(args, call_kwargs, options)
        # A skipped send is logged and counted below, never raised at the scheduler (a task
        # declared on_duplicate="raise" would make every skip an error).
        options["on_duplicate"] = "return"
        return publish_unique(Call(self.app, task, task_name, args, call_kwargs, options, publish))

    def _claim_tick(
        self, entry: Any, name: str, task_name: str
    ) -> tuple[bool, tuple[str, bytes] | None]:
        """Whether this beat sends this tick of ``entry`` (it claimed it, or cannot ask), and
        the key and value of its claim (None: unclaimed)."""
        runtime = installed(self.app)
        tick = tick_of(entry.schedule)
        if runtime is None or tick is None:
            return True, None
        store, prefix = runtime.store, runtime.config.key_prefix
        key = tick_key(prefix, name, tick.number)
        value = self._claimant + str(next(self._claims)).encode()
        try:
            claimed, holder = _claim(store, key, value, tick.ttl_ms)
            if (
                not claimed
                and holder is not None
                and tick.following is not None
                and holder.startswith(self._claimant)
            ):
                # An interval's slot is this beat's already when Celery finds the entry due a
                # hair inside it, an interval after the last send: that send is the next
                # slot's. (A crontab tick this beat sent already is not sent again.)
                key = tick_key(prefix, name, tick.following)
                claimed, _ = _claim(store, key, value, tick.ttl_ms)
        except RedisUnavailable as exc:
            if runtime.config.on_redis_error == "raise":
                raise
            emit(UNAVAILABLE, task_name, "", key, action="is sent unclaimed", error=exc.cause)
            return True, None
        if not claimed:
            self.dedupe_ticks_skipped[name] += 1
            logger.info(
                "beat: not sending %s (%s): another beat sent this tick (skipped %s)",
                name,
                task_name,
                _times(self.dedupe_ticks_skipped[name]),
            )
            return False, None
        return True, (key, value)

    def _give_up_tick(self, key: str, value: bytes, task_name: str) -> None:
        """Free this beat's claim of a tick it failed to send: the other beats skip a claimed
        tick, and would leave it sent by nobody (plain beats would each have sent it)."""
        runtime = installed(self.app)
        if runtime is None:
            return
        try:
            runtime.store.free_tick(key, value)
        except DedupeError as exc:  # (the send's own error is the one raised)
            logger.warning(
                "beat: %s's tick claim %s outlives its failed send (%s): no other beat sends "
                "that tick",
                task_name,
                key,
                exc,
            )

    def _count_send(self) -> None:
        count_beat_send(self)


def entry_options(entry: Any) -> tuple[bool, dict[str, Any]]:
    """Whether ``entry`` is deduplicated, and the Celery options of one send of it with the
    dedup options of its ``dedupe`` header merged in.

    The entry itself is never changed: the headers are a copy, so ours do not pile up in
    it across sends.
    """
    options = dict(entry.options or {})
    headers = dict(options.get("headers") or {})
    headers.pop(HEADER, None)
    headers["celery_beat_task"] = True
    from_header = headers.pop(OPTIONS_HEADER, None)
    if isinstance(from_header, Mapping):
        options.update(from_header)
    options["headers"] = headers
    return _truthy(options.pop("unique", True)), options


def _claim(store: Store, key: str, value: bytes, ttl_ms: int) -> tuple[bool, bytes | None]:
    """Claim a tick as ``value``: (claimed, who holds it when refused; None: unread).

    A claim whose reply came too late, and that the client sent again, is refused by itself:
    it is this claim's all the same. Raises RedisUnavailable when the claim cannot be sent."""
    if store.claim_tick(key, value, ttl_ms):
        return True, value
    try:
        holder = store.tick_claimant(key)
    except RedisUnavailable:
        return False, None  # (refused: whose it is cannot be told)
    return holder == value, holder


def _limited(task: Any) -> bool:
    """A task with ``key_concurrency`` or ``key_rate_limit``: its calls are never
    deduplicated, each takes its turn."""
    return (
        getattr(task, "key_concurrency", None) is not None
        or getattr(task, "key_rate_limit", None) is not None
    )


def _times(count: int) -> str:
    return "1 time" if count == 1 else f"{count} times"


def _truthy(value: Any) -> bool:
    # Entries stored as JSON (django-celery-beat, RedBeat) may spell it as a string.
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "0", "no", "off", "")
    return bool(value)


class DedupeScheduler(DedupeSchedulerMixin, PersistentScheduler):
    """Celery's default scheduler (``PersistentScheduler``), deduplicating."""
