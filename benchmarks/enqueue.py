"""Enqueue cost: plain apply_async against dedup accepted and duplicate calls (and peers).

Accepted calls use distinct arguments (a new key each); duplicate calls repeat one call
whose key is held. Each round's accepted calls are cleared (queue and keys) untimed.

On a Redis broker the dedup store is the broker's own Redis (the default, and the one-step
path); on RabbitMQ the records live in the Redis given (the provisional path).
"""

from __future__ import annotations

import functools
import select
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis
from celery import Celery, Task

import dedupe

from . import _peers as peers
from ._env import Timings, Variant, interleaved, make_app

PLAIN = "plain apply_async"
#: Calls per batch of the bulk variants (each is timed per call).
BATCH = 100
#: One round trip to the same Redis through redis-py (a PING), timed in the same rounds.
ROUND_TRIP = "redis-py PING"
#: A plain publish, then one PING on a socket of its own, its reply polled for as the dedup
#: store's is: a round trip in the rhythm of real calls, where Redis has been idle for a
#: publish's time before each. Its ratio less 1.0 is what a round trip adds to a call, the
#: floor of a duplicate's ratio (a duplicate is one round trip and our CPU).
FLOOR = "plain apply_async + one polled round trip"
#: A duplicate of an app that remembers answers (``dedupe_remember_duplicates=1``, off by
#: default): a thread's repeated duplicate is answered from memory, without a round trip.
REMEMBERED = "dedupe duplicate, remembered (dedupe_remember_duplicates=1)"


#: Calls through Celery's own apply_async, as with a tracing or APM agent that wraps it (Sentry,
#: Datadog, New Relic): dedupe's single-call sender steps aside for the wrapper. Each is timed
#: against a plain call through the same wrapper.
TRACED_PLAIN = "plain apply_async, wrapped (an APM agent's place)"
TRACED_ACCEPTED = "dedupe accepted, wrapped: Celery's own path"


class _Traced(Task):  # type: ignore[misc]
    """A task whose apply_async is wrapped in place, as an APM agent wraps Celery's."""

    @functools.wraps(Task.apply_async)
    def apply_async(self, *args: Any, **kwargs: Any) -> Any:
        return Task.apply_async(self, *args, **kwargs)


class _TracedDedupe(dedupe.DedupeTask, _Traced):  # type: ignore[misc]
    """A DedupeTask whose accepted calls reach the wrapped apply_async."""


def _traced(app: Celery) -> tuple[Any, Any]:
    """A plain task and a unique one of ``app``, each behind the wrapper."""

    @app.task(shared=False, base=_Traced)
    def traced_plain(x: int) -> None: ...

    @app.task(shared=False, base=_TracedDedupe, unique=True)
    def traced_unique(x: int) -> None: ...

    return traced_plain, traced_unique


def _remembered_duplicate(broker: str, **conf: Any) -> tuple[Callable[[int], Any], Celery]:
    """:data:`REMEMBERED`'s call, a duplicate of a key held in an app of its own, and that app
    (its queue holds the holder's message)."""
    app = make_app(broker, dedupe_remember_duplicates=1, **conf)

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def asked(x: int) -> None: ...

    asked.delay(-1)
    return (lambda i: asked.apply_async((-1,))), app


def _clearer(
    client: redis.Redis,
    empty_queue: Callable[[], object],
    patterns: tuple[str, ...],
    hold: Callable[[], Any] | None,
) -> Callable[[], None]:
    """What clears a variant's round: its queue emptied, the keys of ``patterns`` deleted,
    then ``hold`` (a call that holds the key the duplicates meet)."""

    def clear() -> None:
        empty_queue()
        for pattern in patterns:
            keys = list(client.scan_iter(match=pattern, count=10_000))
            if keys:
                client.delete(*keys)
        if hold is not None:
            hold()

    return clear


def run(url: str, rounds: int, calls: int) -> Timings:
    """Microseconds per call of each variant, per round."""
    client = redis.Redis.from_url(url)

    def clearer(app: Celery, *patterns: str, hold: Callable[[], Any] | None = None) -> Any:
        return _clearer(client, lambda: client.delete(app.conf.task_default_queue), patterns, hold)

    app = make_app(url)

    @app.task(shared=False)
    def plain(x: int) -> None: ...

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def unique(x: int) -> None: ...

    held = [(-1 - n,) for n in range(BATCH)]

    def hold() -> None:
        unique.delay(-1)  # the duplicate variants' holders
        unique.map_unique(held)

    def bulk(arguments: Callable[[int], list[tuple[int]]]) -> Callable[[int], Any]:
        # One batch per BATCH timed calls: each call's time is its share of a batch.
        return lambda i: unique.map_unique(arguments(i)) if i % BATCH == 0 else None

    hold()
    prefix = app.conf.dedupe_key_prefix
    traced_plain, traced_unique = _traced(app)
    variants: dict[str, Variant] = {
        PLAIN: (lambda i: plain.apply_async((i,)), clearer(app)),
        TRACED_PLAIN: (lambda i: traced_plain.apply_async((i,)), clearer(app)),
        TRACED_ACCEPTED: (
            lambda i: traced_unique.apply_async((i,)),
            clearer(app, f"{prefix}:*", hold=hold),
        ),
        "dedupe accepted": (
            lambda i: unique.apply_async((i,)),
            clearer(app, f"{prefix}:*", hold=hold),
        ),
        "dedupe duplicate": (lambda i: unique.apply_async((-1,)), None),
        REMEMBERED: (_remembered_duplicate(url)[0], None),
        "dedupe bulk accepted": (
            bulk(lambda i: [(j,) for j in range(i, i + BATCH)]),
            clearer(app, f"{prefix}:*", hold=hold),
        ),
        "dedupe bulk duplicate": (bulk(lambda i: held), None),
        # The scale of a round trip: every dedup call waits for one.
        ROUND_TRIP: (lambda i: client.ping(), None),
        FLOOR: (_then_a_round_trip(url, lambda i: plain.apply_async((i,))), clearer(app)),
    }
    variants.update(_peers(url, url, clearer)[0])
    return interleaved(variants, rounds, calls)


def run_rabbitmq(redis_url: str, amqp_url: str, rounds: int, calls: int) -> Timings | None:
    """The same on a RabbitMQ broker (None when it is not reachable)."""
    from kombu import Connection

    try:
        with Connection(amqp_url, connect_timeout=2) as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as exc:
        print(f"RabbitMQ not reachable at {amqp_url}, its table is left out: {exc!r}")
        return None
    client = redis.Redis.from_url(redis_url)
    app = make_app(amqp_url, dedupe_redis_url=redis_url)

    @app.task(shared=False)
    def plain(x: int) -> None: ...

    @app.task(shared=False, base=dedupe.DedupeTask, unique=True)
    def unique(x: int) -> None: ...

    def clearer(made: Celery, *patterns: str, hold: Callable[[], Any] | None = None) -> Any:
        def purge() -> None:
            with made.connection_for_write() as connection:
                connection.default_channel.queue_purge(made.conf.task_default_queue)

        return _clearer(client, purge, patterns, hold)

    clear = clearer(app, f"{app.conf.dedupe_key_prefix}:*", hold=lambda: unique.delay(-1))
    plain.delay(0)  # declares the queue
    clear()
    remembered, remembered_app = _remembered_duplicate(amqp_url, dedupe_redis_url=redis_url)
    traced_plain, traced_unique = _traced(app)
    variants: dict[str, Variant] = {
        PLAIN: (lambda i: plain.apply_async((i,)), clear),
        TRACED_PLAIN: (lambda i: traced_plain.apply_async((i,)), clear),
        TRACED_ACCEPTED: (lambda i: traced_unique.apply_async((i,)), clear),
        "dedupe accepted": (lambda i: unique.apply_async((i,)), clear),
        "dedupe duplicate": (lambda i: unique.apply_async((-1,)), None),
        REMEMBERED: (remembered, None),
        FLOOR: (_then_a_round_trip(redis_url, lambda i: plain.apply_async((i,))), clear),
    }
    # The peers keep their locks on the same Redis as dedupe's records (issue 45).
    found, peers_app = _peers(amqp_url, redis_url, clearer, dedupe_redis_url=redis_url)
    variants.update(found)
    try:
        return interleaved(variants, rounds, calls)
    finally:
        for made in (app, remembered_app, peers_app):
            with made.connection_for_write() as connection:
                connection.default_channel.queue_delete(made.conf.task_default_queue)
            made.close()


def _then_a_round_trip(url: str, call: Callable[[int], Any]) -> Callable[[int], Any]:
    """``call``, then a PING whose reply is polled for (as :mod:`dedupe.store.script_runner` polls):
    the :data:`FLOOR` variant."""
    where = urlsplit(url)
    sock = socket.create_connection((where.hostname or "127.0.0.1", where.port or 6379))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    ping = b"*1\r\n$4\r\nPING\r\n"

    def then(i: int) -> None:
        call(i)
        sock.sendall(ping)
        while not poll.poll(0):
            pass
        if sock.recv(64) != b"+PONG\r\n":
            raise RuntimeError("a PING was not answered with PONG")

    return then


def _peers(
    broker: str, store: str, clearer: Callable[..., Any], **conf: Any
) -> tuple[dict[str, Variant], Celery]:
    """celery-once's and celery-singleton's accepted and duplicate calls (when installed: the
    bench extra) on an app of theirs on ``broker``, their locks in the Redis ``store``; and
    that app. ``clearer(app, pattern, hold=...)`` makes a variant's reset."""
    app = make_app(broker, **conf)
    peers.configure(app, store)
    variants: dict[str, Variant] = {}
    for peer, task in peers.tasks(app).items():

        def hold(task: Any = task) -> None:
            task.apply_async((-1,))

        hold()
        variants[f"{peer} accepted"] = (
            lambda i, task=task: task.apply_async((i,)),
            clearer(app, peers.LOCKS[peer], hold=hold),
        )
        variants[f"{peer} duplicate"] = (lambda i, task=task: task.apply_async((-1,)), None)
    return variants, app
