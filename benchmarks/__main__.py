"""Run the benchmarks: ``python -m benchmarks [--quick] [--only NAME ...]`` (or ./noxw -s bench).

Writes benchmarks/results/latest.md and ratios.png, and prints the table.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from . import (
    client,
    derivation,
    enqueue,
    flow,
    greenlets,
    reaper,
    report,
    roundtrips,
    scale,
    topologies,
    webview,
    worker,
)
from ._env import redis_url

BENCHES = (
    "enqueue",
    "rabbitmq",
    "topologies",
    "worker",
    "derivation",
    "scale",
    "roundtrips",
    "greenlets",
    "client",
    "flow",
    "webview",
    "reaper",
)
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--redis", metavar="URL", help="default: a throwaway redis-server")
    parser.add_argument("--amqp", metavar="URL", default=AMQP_URL, help="the RabbitMQ")
    parser.add_argument("--only", nargs="+", choices=BENCHES, default=list(BENCHES))
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller sizes")
    args = parser.parse_args(argv)
    rounds = 5 if args.quick else 11
    results: dict[str, Any] = {}
    with redis_url(args.redis) as url:
        if "enqueue" in args.only:
            results["enqueue"] = enqueue.run(url, rounds, 500 if args.quick else 2000)
        if "rabbitmq" in args.only:
            calls = 300 if args.quick else 1000
            results["rabbitmq"] = enqueue.run_rabbitmq(url, args.amqp, rounds, calls)
        if "topologies" in args.only:
            calls = 300 if args.quick else 1000
            results["topologies"] = topologies.run(url, rounds, calls)
        if "worker" in args.only:
            results["worker"] = worker.run(url, rounds, 200 if args.quick else 500)
            results["worker prefork"] = worker.run_prefork(url, rounds, 500 if args.quick else 2000)
        if "derivation" in args.only:
            results["derivation"] = derivation.run()
        if "scale" in args.only:
            sizes = (1_000, 10_000) if args.quick else (1_000, 100_000, 1_000_000)
            results["scale"] = scale.run(url, sizes, 300 if args.quick else 1000)
        if "roundtrips" in args.only:
            results["roundtrips"] = roundtrips.run(url)
        if "greenlets" in args.only:
            calls = 300 if args.quick else 1000
            results["greenlets"] = greenlets.run(url, rounds, calls)
        if "client" in args.only:
            results["client"] = client.run(url, rounds, 2000 if args.quick else 10_000)
        if "flow" in args.only:
            results["flow"] = flow.run(url, rounds, 300 if args.quick else 1000)
        results.update(_operators(url, args))
    command = "python -m benchmarks " + shlex.join(list(argv if argv is not None else sys.argv[1:]))
    path = report.write(results, command.strip())
    print(path.read_text())
    return 0


def _operators(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The benchmarks of what operators run beside the calls: the web view, the reaper."""
    results: dict[str, Any] = {}
    if "webview" in args.only:
        sizes = (1_000, 10_000) if args.quick else (1_000, 100_000, 1_000_000)
        results["webview"] = webview.run(url, sizes, 5 if args.quick else 20)
    if "reaper" in args.only:
        results["reaper"] = reaper.run((1_000, 10_000) if args.quick else (1_000, 100_000), 5)
    return results


if __name__ == "__main__":
    sys.exit(main())
