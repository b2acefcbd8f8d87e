"""An hour under load, flat: producers and a real prefork worker under steady load, sampled
every few seconds, failing on growth after warm-up (issue 45).

``python -m benchmarks.soak --minutes 60`` (or ``./noxw -s soak -- --minutes 60``) starts a
throwaway redis-server (broker and dedup store; ``--redis URL`` for another), a ``celery worker
-P prefork`` of benchmarks/_soak_app.py and producer processes that call at a steady rate:
new keys, repeats of a few keys, one hot key, debounced calls and calls under
``key_concurrency`` with ``key_rate_limit``. Every ``--every`` seconds it records the RSS,
open file descriptors and sockets of every process (producers, the worker and its children,
redis-server), Redis's memory, keys, clients and queue length, and the rates of calls and
runs. After the warm-up it fits a least-squares line to each series: the fitted growth over
the rest of the run must stay within :data:`BOUNDS`, and no rate may fall by more than its
bound. Samples go to benchmarks/results/soak.jsonl as they come; the verdicts to soak.md
(and the curves to soak.png, with matplotlib); the exit status is 1 if any series grew.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from dedupe.demo.server import RedisServer

from ._env import ROOT, prefork_worker, stop_worker

RESULTS = ROOT / "benchmarks" / "results"
MIB = 1024 * 1024


@dataclass(frozen=True)
class Bound:
    """The most a series may grow over the run after warm-up (its fitted line's rise):
    ``absolute``, or ``relative`` times its median if more. A rate may not fall by more."""

    absolute: float
    relative: float = 0.0

    def allowed(self, median: float) -> float:
        return max(self.absolute, self.relative * abs(median))


#: By the series' last word (see :func:`bound_of`). Memory in MiB.
BOUNDS = {
    "rss": Bound(2.0, 0.03),
    "fds": Bound(2),
    "sockets": Bound(2),
    "used_memory": Bound(1.0, 0.05),
    "keys": Bound(50, 0.10),
    "queued": Bound(50, 0.10),
    "clients": Bound(2),
    # Rates: checked for a fall.
    "calls/s": Bound(0, 0.10),
    "runs/s": Bound(0, 0.10),
}
RATES = ("calls/s", "runs/s")

#: Each producer's calls, in this order, over and over: 4 in 10 new keys, 3 repeats of five
#: keys, one call of the hot key, one debounced (three keys), one limited (four keys).
MIX = (
    *("fresh", "repeat", "fresh", "hot", "repeat"),
    *("fresh", "debounced", "repeat", "fresh", "limited"),
)


#: Every kind of call ``--mix`` may name.
KINDS = frozenset({"plain", "fresh", "repeat", "hot", "debounced", "limited"})


def _mix(text: str) -> tuple[str, ...]:
    kinds = tuple(text.split(","))
    if not set(kinds) <= KINDS:
        raise argparse.ArgumentTypeError(f"kinds of call: {', '.join(sorted(KINDS))}")
    return kinds


def bound_of(series: str) -> Bound:
    return BOUNDS[series.rsplit(" ", 1)[-1]]


# -- the load -------------------------------------------------------------------------------


def produce(
    index: int, url: str, rate: float, mix: tuple[str, ...], counts: Any, stop: Any
) -> None:
    """Call at ``rate`` calls a second, the kinds of ``mix`` in turn, until ``stop`` is set;
    ``counts[index]`` is the number of calls made so far."""
    os.environ["DEDUPE_SOAK_REDIS"] = url
    from . import _soak_app as soak

    start, made = time.monotonic(), 0
    while not stop.is_set():
        kind = mix[made % len(mix)]
        if kind == "plain":
            soak.plain.delay(made)
        elif kind == "fresh":
            soak.fresh.delay(index * 10**12 + made)
        elif kind == "repeat":
            soak.repeat.delay(made % 5)
        elif kind == "hot":
            soak.hot.delay()
        elif kind == "debounced":
            soak.debounced.delay(made % 3, made)
        else:
            soak.limited.delay(made % 4, made)
        made += 1
        counts[index] = made
        # Paced against the start, not the last call: a slow call does not lower the rate.
        time.sleep(max(0.0, start + made / rate - time.monotonic()))


def children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return sorted(
            int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        )
    return []


def process_sample(role: str, pid: int) -> dict[str, float]:
    """RSS (MiB), open file descriptors and sockets of one process ({} once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        links = []
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    except OSError:
        return {}
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return {
        f"{role} rss": rss / 1024,
        f"{role} fds": len(links),
        f"{role} sockets": sum(link.startswith("socket:") for link in links),
    }


class Sampler:
    """One sample of every series, with the rates since the one before."""

    def __init__(self, client: redis.Redis, counts: Any, worker: int, producers: list[int]) -> None:
        self.client, self.counts, self.worker, self.producers = client, counts, worker, producers
        self.started = time.monotonic()
        self.last: tuple[float, float, float] | None = None

    def sample(self) -> dict[str, float]:
        from . import _soak_app as soak

        now = time.monotonic()
        found: dict[str, float] = {"t": now - self.started}
        for index, pid in enumerate(self.producers):
            found.update(process_sample(f"producer-{index}", pid))
        found.update(process_sample("worker", self.worker))
        # By rank, not pid: a child that a worker replaced is the same place in the pool.
        for index, pid in enumerate(children(self.worker)):
            found.update(process_sample(f"worker-child-{index}", pid))
        info = self.client.info()
        found.update(process_sample("redis-server", int(info["process_id"])))
        found["redis used_memory"] = int(info["used_memory"]) / MIB
        found["redis clients"] = int(info["connected_clients"])
        found["redis keys"] = int(self.client.dbsize())
        found["dedup keys"] = sum(1 for _ in self.client.scan_iter(f"{soak.PREFIX}:*", count=1000))
        found["broker queued"] = int(self.client.llen(soak.QUEUE))
        calls, runs = float(sum(self.counts)), float(self.client.get(soak.RUNS) or 0)
        if self.last is not None:
            then, calls_then, runs_then = self.last
            found["calls/s"] = (calls - calls_then) / (now - then)
            found["runs/s"] = (runs - runs_then) / (now - then)
        self.last = (now, calls, runs)
        return found


# -- the verdict ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    series: str
    first: float
    last: float
    median: float
    growth: float
    allowed: float
    ok: bool


def slope(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares line's slope through ``points``."""
    mean_t = statistics.fmean(t for t, _ in points)
    mean_v = statistics.fmean(v for _, v in points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread if spread else 0.0


def verdicts(samples: list[dict[str, float]], warmup: float) -> list[Verdict]:
    """Each series' fitted growth from the end of the warm-up to the last sample, against its
    bound (too few samples after warm-up: nothing is judged)."""
    after = [sample for sample in samples if sample["t"] >= warmup]
    found = []
    names = [name for name in samples[-1] if name != "t"] if samples else []
    for name in names:
        points = [(sample["t"], sample[name]) for sample in after if name in sample]
        if len(points) < 3:
            continue
        values = [v for _, v in points]
        median = statistics.median(values)
        growth = slope(points) * (points[-1][0] - points[0][0])
        allowed = bound_of(name).allowed(median)
        ok = growth >= -allowed if name.endswith(RATES) else growth <= allowed
        found.append(Verdict(name, values[0], values[-1], median, growth, allowed, ok))
    return found


def markdown(found: list[Verdict], command: str, minutes: float, warmup: float) -> str:
    lines = [
        "# Soak",
        "",
        f"`{command}`: {minutes:g} minutes, judged after a warm-up of {warmup / 60:g} minutes. "
        "Growth: the least-squares line's rise from the end of the warm-up to the last "
        "sample; a rate may not fall by more than its bound, anything else may not rise by "
        "more. Memory in MiB.",
        "",
        "| series | after warm-up | last | median | fitted growth | bound | |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for v in found:
        sign = "-" if v.series.endswith(RATES) else "+"
        lines.append(
            f"| {v.series} | {v.first:.1f} | {v.last:.1f} | {v.median:.1f} | {v.growth:+.2f} | "
            f"{sign}{v.allowed:.2f} | {'flat' if v.ok else 'GREW' if sign == '+' else 'FELL'} |"
        )
    return "\n".join(lines) + "\n"


def chart(samples: list[dict[str, float]], warmup: float, path: Path) -> None:
    """The curves (RSS, Redis, rates) when matplotlib is installed (the bench extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    groups = (
        ("RSS, MiB", lambda name: name.endswith(" rss")),
        ("Redis", lambda name: name in ("redis used_memory", "redis clients", "broker queued")),
        ("per second", lambda name: name.endswith(RATES)),
    )
    for ax, (title, chosen) in zip(axes, groups, strict=True):
        for name in [name for name in samples[-1] if chosen(name)]:
            points = [(s["t"] / 60, s[name]) for s in samples if name in s]
            ax.plot(*zip(*points, strict=True), label=name)
        ax.axvline(warmup / 60, color="grey", linestyle=":")
        ax.set_ylabel(title)
        ax.legend(fontsize=7, loc="upper left", ncol=2)
    axes[-1].set_xlabel("minutes")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


# -- the run --------------------------------------------------------------------------------


@contextlib.contextmanager
def soak_redis(given: str | None) -> Iterator[str]:
    if given:
        yield given
        return
    with RedisServer() as server:
        yield server.url


def soak(args: argparse.Namespace, out: Path) -> list[dict[str, float]]:
    """Run the load for ``args.minutes``; the samples."""
    samples: list[dict[str, float]] = []
    with soak_redis(args.redis) as url:
        os.environ["DEDUPE_SOAK_REDIS"] = url
        client = redis.Redis.from_url(url)
        from . import _soak_app

        worker = prefork_worker(
            _soak_app.app, "benchmarks._soak_app", "soak", _soak_app.QUEUE, args.concurrency
        )
        context = multiprocessing.get_context("spawn")
        counts = context.RawArray("q", args.producers)
        stop = context.Event()
        producers = [
            context.Process(target=produce, args=(index, url, args.rate, args.mix, counts, stop))
            for index in range(args.producers)
        ]
        try:
            for process in producers:
                process.start()
            sampler = Sampler(client, counts, worker.pid, [p.pid for p in producers if p.pid])
            end = sampler.started + args.minutes * 60
            with (out / "soak.jsonl").open("w") as jsonl:
                while True:
                    samples.append(sampler.sample())
                    jsonl.write(json.dumps(samples[-1]) + "\n")
                    jsonl.flush()
                    print(_line(samples[-1]), flush=True)
                    dead = [p.name for p in producers if not p.is_alive()]
                    if worker.poll() is not None or dead:
                        raise RuntimeError(f"a soak process died: worker {worker.poll()}, {dead}")
                    if time.monotonic() >= end:
                        break
                    time.sleep(max(0.0, min(args.every, end - time.monotonic())))
        finally:
            stop.set()
            for process in producers:
                process.join(30)
                if process.is_alive():
                    process.kill()
            stop_worker(worker)
            client.close()
    return samples


def _line(sample: dict[str, float]) -> str:
    """A sample in one line, for a run watched as it goes."""
    rss = sum(value for name, value in sample.items() if name.endswith(" rss"))
    parts = [
        f"t={sample['t']:.0f}s",
        f"rss={rss:.1f}MiB",
        f"redis={sample['redis used_memory']:.2f}MiB",
        f"keys={sample['redis keys']:.0f}",
        f"queued={sample['broker queued']:.0f}",
        f"clients={sample['redis clients']:.0f}",
    ]
    parts += [f"{name}={sample[name]:.1f}" for name in RATES if name in sample]
    return " ".join(parts)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument(
        "--every",
        type=float,
        help="seconds between samples (default: 60, or a thirtieth of the run if shorter)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        help="minutes not judged (default: a quarter of the run, 15 at most)",
    )
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=40.0, help="calls a second per producer")
    parser.add_argument("--concurrency", type=int, default=2, help="the worker's processes")
    parser.add_argument("--redis", metavar="URL", help="default: a throwaway redis-server")
    parser.add_argument(
        "--mix",
        type=_mix,
        default=MIX,
        help="the kinds of call, in turn (default: the mix above; 'plain' is Celery alone)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the results go")
    args = parser.parse_args(argv)
    if args.every is None:
        args.every = min(60.0, max(1.0, args.minutes * 60 / 30))
    if args.warmup is None:
        # Under the default mix the worker's children grow for their first 8-9 minutes, then
        # hold (docs/cost.md, the soak): Celery's retry path, a plain retried task's too.
        args.warmup = min(15.0, args.minutes / 4)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    samples = soak(args, args.out)
    found = verdicts(samples, args.warmup * 60)
    command = "python -m benchmarks.soak " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(found, command.strip(), args.minutes, args.warmup * 60)
    (args.out / "soak.md").write_text(text)
    chart(samples, args.warmup * 60, args.out / "soak.png")
    print(text)
    grew = [v.series for v in found if not v.ok]
    if grew:
        print(f"not flat after warm-up: {', '.join(grew)}")
    return 1 if grew or not found else 0


if __name__ == "__main__":
    sys.exit(main())
