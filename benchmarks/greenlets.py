"""A dedup call in a new greenlet against one on a kept connection, under gevent's
monkey-patching: what a ``-P gevent`` worker's task or a gevent web server's request pays.

Store.enqueue of a new key each call, in a process of its own (monkey-patching cannot be
undone). Both variants run on the same runner, so the greenlet variant's cost over the kept
one is a greenlet's spawn and the connection's check-out; one greenlet spawned and joined with
nothing in it is timed too, for scale.
"""

from __future__ import annotations

from ._env import Timings, samples_of_script

NEW_GREENLET = "enqueue, each call in a new greenlet"
KEPT = "enqueue, every call in one greenlet (a kept connection)"
SPAWN = "an empty greenlet spawned and joined"

_SCRIPT = """
from gevent import monkey

monkey.patch_all()

import itertools
import json
import sys

import gevent
import redis

from benchmarks._env import interleaved
from dedupe.store.store import Store
from dedupe.values.keys import CallKeys
from dedupe.values.record import pack_queued

url, rounds, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
client = redis.Redis.from_url(url)
store = Store(client)
prefix = "bench-greenlets:"
record = pack_queued("t", 0.0, None)


def enqueue(i):
    key = f"{prefix}{i}"
    store.enqueue(CallKeys(key, key), record, 60_000)


def clear():
    keys = list(client.scan_iter(match=prefix + "*", count=10_000))
    if keys:
        client.delete(*keys)


enqueue(-1)  # scripts loaded, a connection open
timings = interleaved(
    {
        "new": (lambda i: gevent.spawn(enqueue, i).join(), clear),
        "kept": (enqueue, clear),
        "spawn": (lambda i: gevent.spawn(int).join(), None),
    },
    rounds,
    calls,
)
clear()
print(json.dumps(timings.samples))
"""


def run(url: str, rounds: int, calls: int) -> Timings:
    """Microseconds per call of each variant, per round, rounds interleaved."""
    samples = samples_of_script(_SCRIPT, url, str(rounds), str(calls))
    names = {"new": NEW_GREENLET, "kept": KEPT, "spawn": SPAWN}
    return Timings({names[short]: times for short, times in samples.items()})
