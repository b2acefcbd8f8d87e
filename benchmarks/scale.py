"""Cost of a call as the number of live keys grows, and Redis memory per live key."""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis

from dedupe.demo.server import RedisServer
from dedupe.store.store import Store
from dedupe.values.keys import call_keys
from dedupe.values.record import pack_queued

from ._env import Variant, interleaved

# Fills the keyspace with real-looking records, in chunks, inside Redis.
FILL = """
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  redis.call('SET', ARGV[3] .. string.format('%032x', i) .. '}', ARGV[4], 'PX', ARGV[5])
end
return 1
"""


def run(broker_url: str, sizes: tuple[int, ...], calls: int) -> dict[str, object]:
    """At each keyspace size: the enqueue round trip (a new key, and a held key), and a bare
    PING in the same interleaved rounds. The ratio to PING cancels the drift of the machine
    between sizes; a flat ratio means the number of live keys costs nothing."""
    results: dict[str, Any] = {}
    with RedisServer() as store_server:
        client = redis.Redis.from_url(store_server.url)
        store = Store(redis.Redis.from_url(store_server.url))
        fill = client.register_script(FILL)
        record = pack_queued(str(uuid.uuid4()), time.time(), None)
        prefix = "dedupe:{bench.fill:"
        held = call_keys("dedupe", "bench.scale", "f" * 32, separate_run_lock=False)
        store.enqueue(held, pack_queued("holder", time.time(), None), 3_600_000)
        counter = [0]

        def accepted(_: int) -> None:
            counter[0] += 1
            keys = call_keys("dedupe", "bench.scale", f"{counter[0]:032x}", separate_run_lock=False)
            store.enqueue(keys, record, 3_600_000)

        def clear_accepted() -> None:
            names = list(client.scan_iter(match="dedupe:{bench.scale:0*", count=10_000))
            if names:
                client.delete(*names)

        # The reference: a PING over a connection of its own, as the store's scripts go.
        pool = store.client.connection_pool
        connection = pool.connection_class(**pool.connection_kwargs)

        def ping(_: int) -> None:
            connection.send_packed_command([b"*1\r\n$4\r\nPING\r\n"], check_health=False)
            connection.read_response()

        variants: dict[str, Variant] = {
            "ping": (ping, None),
            "accepted": (accepted, clear_accepted),
            "duplicate": (lambda _: store.enqueue(held, record, 3_600_000), None),
        }
        interleaved(variants, 3, calls)  # warm up
        filled = 0
        for size in sizes:
            while filled < size:
                chunk = min(size, filled + 100_000)
                fill(args=[filled + 1, chunk, prefix, record, 3_600_000])
                filled = chunk
            timing = interleaved(variants, 9, calls)
            results[f"{size:,} live keys"] = timing
        used = client.info("memory")["used_memory"]
        client.flushall()
        base = client.info("memory")["used_memory"]
        results["used_memory per key"] = (used - base) / filled
        results["MEMORY USAGE"] = _memory_usage(client)
    return results


#: A typical worker: an EC2 host name, and a pid past 65535 (4 bytes packed, as on hosts
#: whose pid_max is the 4194304 of modern Linux).
HOST, PID = "ip-10-0-12-34.ec2.internal", 1_234_567


def _memory_usage(client: redis.Redis) -> dict[str, int]:
    """MEMORY USAGE of one queued and one running record, with typical names."""
    store = Store(client)
    keys = call_keys(
        "dedupe", "proj.tasks.sync_customer", uuid.uuid4().hex, separate_run_lock=False
    )
    task_id = str(uuid.uuid4())
    store.enqueue(keys, pack_queued(task_id, time.time(), None), 3_600_000)
    queued = int(client.memory_usage(keys.call) or 0)
    store.claim(keys, task_id, "0123456789ab", 60_000, HOST, PID, int(time.time()))
    running = int(client.memory_usage(keys.call) or 0)
    return {"queued": queued, "running": running}
