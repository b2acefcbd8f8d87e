"""Under gevent's monkey-patching every call may come in a greenlet of its own (a ``-P gevent``
worker's task, a gevent web server's request): the calls share a bounded set of connections
instead of opening one per greenlet.

Monkey-patching cannot be undone, so each test runs its script in a process of its own.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from .conftest import RedisFactory
from .helpers import run_script

pytest.importorskip("gevent")

_PRELUDE = """
from gevent import monkey

monkey.patch_all()

import json
import sys

import gevent
import redis

from dedupe.store.store import Store
from dedupe.values.keys import CallKeys
from dedupe.values.record import pack_queued

URL = sys.argv[1]
admin = redis.Redis.from_url(URL)


def connections_made():
    return admin.info("stats")["total_connections_received"]


def enqueue(store, key):
    return store.enqueue(CallKeys(key, key), pack_queued("t" + key, 0.0, None), 60_000)


def each_in_a_greenlet(call, args):
    greenlets = [gevent.spawn(call, *arg) for arg in args]
    gevent.joinall(greenlets, raise_error=True)
    return [greenlet.value for greenlet in greenlets]
"""


def _run(script: str, url: str) -> Any:
    return run_script(textwrap.dedent(_PRELUDE) + textwrap.dedent(script), url)


def test_calls_each_in_a_new_greenlet_share_at_most_the_default_cap_of_connections(
    redis_factory: RedisFactory,
) -> None:
    found = _run(
        """
        store = Store(redis.Redis.from_url(URL))
        before = connections_made()
        for n in range(300):  # one after another, each in a greenlet of its own
            gevent.spawn(enqueue, store, f"k{n}").join()
        print(json.dumps(connections_made() - before))
        """,
        redis_factory().url,
    )
    assert found <= 50


def test_calls_in_new_greenlets_accept_new_keys_and_refuse_repeats(
    redis_factory: RedisFactory,
) -> None:
    found = _run(
        """
        store = Store(redis.Redis.from_url(URL))
        keys = [(store, f"k{n}") for n in range(300)]
        first = each_in_a_greenlet(enqueue, keys)
        again = each_in_a_greenlet(enqueue, keys)
        same = each_in_a_greenlet(enqueue, [(store, "one")] * 300)
        print(json.dumps({
            "accepted": sum(holder is None for holder in first),
            "repeats refused by their holder": sum(
                holder is not None and holder.task_id == "t" + key
                for holder, (_, key) in zip(again, keys)
            ),
            "one key accepted": sum(holder is None for holder in same),
        }))
        """,
        redis_factory().url,
    )
    assert found == {
        "accepted": 300,
        "repeats refused by their holder": 300,
        "one key accepted": 1,
    }


def test_concurrent_greenlets_waiting_on_a_slow_reply_stay_within_the_clients_max_connections(
    redis_factory: RedisFactory,
) -> None:
    found = _run(
        """
        store = Store(redis.Redis.from_url(URL, max_connections=8))
        before = connections_made()
        # The server answers nobody for half a second: every call is in flight at once.
        # (CLIENT PAUSE, not DEBUG SLEEP: a Redis 7 refuses DEBUG unless started to allow it,
        # and one before 7 does not know the option that allows it.)
        admin.execute_command("CLIENT", "PAUSE", "500")
        answers = each_in_a_greenlet(enqueue, [(store, f"k{n}") for n in range(300)])
        print(json.dumps({
            "connections": connections_made() - before,
            "accepted": sum(holder is None for holder in answers),
        }))
        """,
        redis_factory().url,
    )
    assert found["connections"] <= 8
    assert found["accepted"] == 300
