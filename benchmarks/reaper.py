"""The reaper's cost per pass (dedupe.runs.reaping) as the live keys grow: wall time, and the
commands and server time it takes on the dedup Redis and on the Redis broker.

Two cases at each size, on two servers (broker and store apart):
- **young**: every record younger than the margin, the steady state: a pass reads the keys
  and asks the broker nothing;
- **old, all queued**: every record past the margin with its message waiting in the queue
  (a backlog): a pass reads every key and every message, and frees nothing.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from typing import Any

import redis
from celery import Celery

import dedupe
from dedupe.demo.server import RedisServer
from dedupe.runs.reaping import Reaper
from dedupe.runs.runtime import runtime_of
from dedupe.values.keys import format_call_key
from dedupe.values.record import pack_queued

from ._env import commandstats

__all__ = ["run", "summary"]

_CHUNK = 10_000
PREFIX = "reap"


def run(sizes: tuple[int, ...], rounds: int) -> dict[str, Any]:
    """Per size and case: the median pass (seconds, keys and messages read) and the commands
    and server microseconds per pass on each server."""
    results: dict[str, Any] = {}
    for size in sizes:
        with RedisServer() as broker, RedisServer() as store:
            app = Celery(f"reap{uuid.uuid4().hex[:6]}", broker=broker.url, set_as_current=False)
            app.conf.update(
                task_default_queue="reap-q",
                dedupe_redis_url=store.url,
                dedupe_key_prefix=PREFIX,
                dedupe_reap_margin=60,
            )
            dedupe.install(app)
            ids = _fill(app, broker.url, store.url, size)
            reaper = Reaper(runtime_of(app))
            for case, now in (("young", time.time()), ("old, all queued", time.time() + 3600)):
                results[f"{size:,} keys, {case}"] = _passes(
                    reaper, now, rounds, broker.url, store.url
                )
            assert len(ids) == size
        app.close()
    return results


def _fill(app: Celery, broker_url: str, store_url: str, size: int) -> list[str]:
    """``size`` queued records, each with its message in the queue (a real message's JSON,
    its id changed)."""
    app.send_task("bench.reap", (1,))  # (declares the queue and its binding; a template)
    broker = redis.Redis.from_url(broker_url)
    template = broker.rpop("reap-q")
    assert isinstance(template, bytes)
    first = str(json.loads(template)["headers"]["id"])
    store = redis.Redis.from_url(store_url)
    ids = [str(uuid.uuid4()) for _ in range(size)]
    for start in range(0, size, _CHUNK):
        chunk = ids[start : start + _CHUNK]
        with store.pipeline(transaction=False) as pipe:
            for index, task_id in enumerate(chunk, start):
                key = format_call_key(PREFIX, "bench.reap", f"{index:032x}")
                pipe.set(key, pack_queued(task_id, time.time(), None), px=7_200_000)
            pipe.execute()
        broker.lpush("reap-q", *(template.replace(first.encode(), i.encode()) for i in chunk))
    return ids


def _passes(reaper: Reaper, now: float, rounds: int, broker_url: str, store_url: str) -> Any:
    servers = {"store": redis.Redis.from_url(store_url), "broker": redis.Redis.from_url(broker_url)}
    walls, keys, messages = [], [], []
    before = {name: commandstats(client) for name, client in servers.items()}
    for _ in range(rounds):
        done = reaper.sweep(now=now)
        assert done.freed == []
        assert not done.blind
        walls.append(done.seconds)
        keys.append(done.keys_read)
        messages.append(done.messages_read)
    after = {name: commandstats(client) for name, client in servers.items()}
    found: dict[str, Any] = {
        "seconds": statistics.median(walls),
        "range": (min(walls), max(walls)),
        "keys read": statistics.median(keys),
        "messages read": statistics.median(messages),
    }
    for name in servers:
        calls = sum(c for c, _ in after[name].values()) - sum(c for c, _ in before[name].values())
        usec = sum(u for _, u in after[name].values()) - sum(u for _, u in before[name].values())
        found[f"{name} commands"] = calls / rounds
        found[f"{name} server ms"] = usec / rounds / 1000
    return found


def summary(results: dict[str, Any]) -> list[str]:
    """The table for latest.md."""
    lines = [
        "## The reaper: one pass",
        "",
        "Median of the passes (range of wall time); commands and server time per pass on the "
        "dedup Redis and on the Redis broker. Young: no record past the margin (the steady "
        "state). Old, all queued: every record past it, its message waiting (a backlog).",
        "",
        "| keys, case | wall ms (range) | keys read | messages read | store cmds / ms | "
        "broker cmds / ms |",
        "|---|---|---|---|---|---|",
    ]
    for name, found in results.items():
        low, high = found["range"]
        lines.append(
            f"| {name} | {found['seconds'] * 1000:.1f} ({low * 1000:.1f}-{high * 1000:.1f}) | "
            f"{found['keys read']:.0f} | {found['messages read']:.0f} | "
            f"{found['store commands']:.0f} / {found['store server ms']:.1f} | "
            f"{found['broker commands']:.0f} / {found['broker server ms']:.1f} |"
        )
    return [*lines, ""]
