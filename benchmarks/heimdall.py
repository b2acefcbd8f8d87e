"""What celery-heimdall does with duplicates, measured: ``python -m benchmarks.heimdall``.

The README's "Compared with" column for celery-heimdall comes from this probe and its code.
Needs the bench extra (celery-heimdall); starts a throwaway redis-server unless given --redis.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import redis
from celery import Celery, chain

from ._env import redis_url


def probe(url: str) -> dict[str, Any]:
    from celery_heimdall import HeimdallTask

    app = Celery("heimdall-probe", broker=url, backend=url, set_as_current=False)

    @app.task(shared=False, base=HeimdallTask, heimdall={"unique": True}, bind=True)
    def work(self: Any, x: Any, flag: bool = False) -> Any:
        return x

    client = redis.Redis.from_url(url)
    client.flushdb()

    def commands() -> int:
        return sum(stat["calls"] for stat in client.info("commandstats").values())

    first = work.apply_async(args=(1,))
    before = commands()
    started = time.perf_counter()
    duplicate = work.apply_async(args=(1,))
    elapsed = time.perf_counter() - started
    spent = commands() - before - 1  # the second INFO counts itself
    facts = {
        "duplicate answered with the holder's id": duplicate.id == first.id,
        "duplicate call (ms)": round(elapsed * 1000),
        "Redis commands per duplicate call": spent,
        "f(1) and f(x=1) are one call": work.apply_async(kwargs={"x": 1}).id == first.id,
        "f(1) and f(1, False) are one call": work.apply_async(args=(1, False)).id == first.id,
        "2 and 2.0 collide": work.apply_async(args=(2,)).id == work.apply_async(args=(2.0,)).id,
        '{1: "a"} and {"1": "a"} collide': (
            work.apply_async(args=({1: "a"},)).id == work.apply_async(args=({"1": "a"},)).id
        ),
        "key ttl (s)": max(client.ttl(key) for key in client.scan_iter("h-lock:*")),
    }
    queued = client.llen("celery")
    chain(work.s(1), work.si(5)).apply_async()
    facts["messages a chain with a duplicate first member publishes"] = (
        client.llen("celery") - queued
    )
    client.flushdb()
    app.close()
    return facts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.heimdall")
    parser.add_argument("--redis", metavar="URL", help="default: a throwaway redis-server")
    args = parser.parse_args(argv)
    with redis_url(args.redis) as url:
        for name, value in probe(url).items():
            print(f"{name}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
