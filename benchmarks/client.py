"""The store's client per call: one EVALSHA round trip (a duplicate's enqueue, the most
frequent call) through dedupe's client, against the same script through redis-py's own
``Script.__call__`` on the same server; each with redis-py's hiredis parser and with its
Python parser (hiredis hidden from the process).

Each parser runs in a process of its own (redis-py picks its parser at import); within one,
the variants run in interleaved rounds.
"""

from __future__ import annotations

from ._env import Timings, samples_of_script

DEDUPE = "dedupe's client"
REDIS_PY = "redis-py's Script"
PARSERS = ("hiredis", "python")

_SCRIPT = """
import json
import sys

if sys.argv[4] == "python":
    sys.modules["hiredis"] = None  # (redis-py then reads replies with its own parser)

import redis
from redis.utils import HIREDIS_AVAILABLE

from benchmarks._env import interleaved
from dedupe.store.store import Store, script_text
from dedupe.values import defaults
from dedupe.values.keys import CallKeys
from dedupe.values.record import pack_queued

url, rounds, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
assert HIREDIS_AVAILABLE == (sys.argv[4] == "hiredis"), "hiredis is not installed"
client = redis.Redis.from_url(url)
store = Store(client, busy_poll=defaults.BUSY_POLL_US / 1e6)
keys = CallKeys("bench-client:held", "bench-client:held")
store.enqueue(keys, pack_queued("holder", 0.0, None), 600_000)
record = pack_queued("duplicate", 0.0, None)
script = client.register_script(script_text("enqueue"))
args = [keys.call]


def through_redis_py(i):
    script(keys=args, args=[record, 600_000], client=client)


def through_dedupe(i):
    store.enqueue(keys, record, 600_000)


through_redis_py(0)
through_dedupe(0)
timings = interleaved(
    {"dedupe": (through_dedupe, None), "redis-py": (through_redis_py, None)}, rounds, calls
)
client.delete(keys.call)
print(json.dumps(timings.samples))
"""


def name(variant: str, parser: str) -> str:
    return f"{variant}, {parser} parser"


def run(url: str, rounds: int, calls: int) -> Timings:
    """Microseconds per call of each variant and parser, per round."""
    samples: dict[str, list[float]] = {}
    for parser in PARSERS:
        found = samples_of_script(_SCRIPT, url, str(rounds), str(calls), parser)
        samples[name(DEDUPE, parser)] = found["dedupe"]
        samples[name(REDIS_PY, parser)] = found["redis-py"]
    return Timings(samples)
