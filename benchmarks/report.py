"""The benchmark report: a markdown table (printed, and written to benchmarks/results/) and a
PNG bar chart of the ratios (when matplotlib is installed: the bench extra)."""

from __future__ import annotations

import datetime as dt
import platform
from pathlib import Path
from typing import Any

from . import client, flow, reaper, webview
from ._env import Timings
from .enqueue import FLOOR, PLAIN, ROUND_TRIP, TRACED_ACCEPTED, TRACED_PLAIN
from .greenlets import KEPT, NEW_GREENLET
from .scale import HOST

RESULTS = Path(__file__).resolve().parent / "results"

TARGETS = {
    "dedupe accepted": ("<=", 1.05),
    "dedupe duplicate": ("<=", 0.20),
    "dedupe bulk accepted": ("<=", 0.30),
    "dedupe bulk duplicate": ("<=", 0.05),
    "rabbitmq dedupe accepted": ("<=", 1.25),
    "rabbitmq dedupe duplicate": ("<=", 0.20),
    "worker throughput": (">=", 0.90),  # (issue 45; 0.80 before it, 0.75 before issue 28)
    # Accepted calls through Celery's own apply_async (wrapped, as by an APM agent), each
    # against a plain call through the same wrapper (issue 28).
    "celery's path accepted": ("<=", 1.0),
    "rabbitmq celery's path accepted": ("<=", 1.35),
    "10 small arguments": ("<=", 15.0),
    "memory per live key": ("<=", 200),
    NEW_GREENLET: ("<=", 1.5),
}


#: The worker results, each with its pool's short name (the chart's) and its table's.
WORKERS = {
    "worker": ("solo", "solo pool"),
    "worker prefork": ("prefork", "prefork pool of two processes"),
}


def enqueue_ratios(enqueue: Timings) -> dict[str, float]:
    """Each variant's cost per call relative to plain apply_async in the same rounds."""
    return {name: enqueue.ratio(name, PLAIN) for name in enqueue.samples}


def verdict(name: str, value: float) -> str:
    rule = TARGETS.get(name)
    if rule is None:
        return ""
    op, bound = rule
    ok = value <= bound if op == "<=" else value >= bound
    return f"{'met' if ok else 'MISSED'} ({op} {bound:g})"


def _celerys_path(timings: Timings, target: str) -> list[str]:
    """The accepted call through Celery's own apply_async against a plain call through the
    same wrapper: what a user of an APM agent pays."""
    if TRACED_ACCEPTED not in timings.samples:
        return []
    ratio = timings.ratio(TRACED_ACCEPTED, TRACED_PLAIN)
    lines = [
        f"Through Celery's own path (apply_async wrapped, as by an APM agent): dedupe accepted "
        f"{ratio:.2f}x the wrapped plain call; {verdict(target, ratio)}."
    ]
    if FLOOR in timings.samples:
        # An accepted call waits for one round trip at least: where a round trip is dear
        # beside a publish, the floor itself is above a ratio target set on another machine.
        floor = timings.ratio(FLOOR, PLAIN)
        above = timings.ratio(TRACED_ACCEPTED, FLOOR)
        lines.append(
            f"Its floor here, a plain call and one polled round trip, is {floor:.2f}x plain: "
            f"the wrapped accepted call costs {above:.2f}x the floor."
        )
    return [*lines, ""]


def _topologies(topologies: Timings | None) -> list[str]:
    if not topologies:
        return []
    lines = [
        "## Enqueue cost by dedup store (the broker: the single Redis)",
        "",
        f"Median of {len(topologies.samples[PLAIN])} interleaved rounds, as above. The "
        "records on a Redis of their own, on a Sentinel-named master and on a Redis Cluster "
        "(three masters with a replica each) all take the provisional path (the store is not "
        "the broker).",
        "",
        "| variant | us/call | x plain |",
        "|---|---:|---:|",
    ]
    for name in topologies.samples:
        ratio = topologies.ratio(name, PLAIN)
        lines.append(f"| {name} | {topologies.median(name):.0f} | {ratio:.2f} |")
    return [*lines, ""]


def markdown(results: dict[str, Any], command: str) -> str:
    lines = [
        f"# celery-dedupe benchmarks, {dt.date.today().isoformat()}",
        "",
        f"`{command}` on {platform.node()} ({platform.machine()}, Python "
        f"{platform.python_version()}). Absolute times drift on shared machines; the ratios "
        f"come from rounds interleaved in one run.",
        "",
    ]
    enqueue: Timings | None = results.get("enqueue")
    if enqueue:
        ratios = enqueue_ratios(enqueue)
        lines += [
            "## Enqueue cost",
            "",
            f"Median of {len(enqueue.samples[PLAIN])} interleaved rounds; x plain is the median "
            f"of the ratios within each round. {ROUND_TRIP!r}: one redis-py round trip, for "
            f"scale. {FLOOR!r}: less 1.0, what one round trip adds to a call in the rhythm of "
            "real calls (Redis idle for a publish's time before it), the floor of a duplicate.",
            "",
            "| variant | us/call | x plain | target |",
            "|---|---:|---:|---|",
        ]
        for name, ratio in ratios.items():
            lines.append(
                f"| {name} | {enqueue.median(name):.0f} | {ratio:.2f} | {verdict(name, ratio)} |"
            )
        lines += ["", *_celerys_path(enqueue, "celery's path accepted")]
    rabbitmq: Timings | None = results.get("rabbitmq")
    if rabbitmq:
        lines += [
            "## Enqueue cost on RabbitMQ (dedup records in Redis: the provisional path)",
            "",
            f"Median of {len(rabbitmq.samples[PLAIN])} interleaved rounds, as above; "
            f"{FLOOR!r} as above.",
            "",
            "| variant | us/call | x plain | target |",
            "|---|---:|---:|---|",
        ]
        for name in rabbitmq.samples:
            ratio = rabbitmq.ratio(name, PLAIN)
            target = verdict(f"rabbitmq {name}", ratio)
            lines.append(f"| {name} | {rabbitmq.median(name):.0f} | {ratio:.2f} | {target} |")
        lines += ["", *_celerys_path(rabbitmq, "rabbitmq celery's path accepted")]
    lines += _topologies(results.get("topologies"))
    for kind, (_, pool) in WORKERS.items():
        lines += _worker(results.get(kind), pool)
    derivation = results.get("derivation")
    if derivation:
        lines += ["## Key derivation", "", "| arguments | us | target |", "|---|---:|---|"]
        lines += [
            f"| {name} | {micros:.1f} | {verdict(name, micros)} |"
            for name, micros in derivation.items()
        ]
        lines.append("")
    scale = results.get("scale")
    if scale:
        lines += [
            "## Scale: the enqueue round trip as live keys grow",
            "",
            "Interleaved with a bare PING at each size: the ratio to PING is what the "
            "number of keys could change.",
            "",
            "| live keys | PING us | accepted us | x PING | duplicate us | x PING |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, timing in scale.items():
            if name.endswith("live keys"):
                lines.append(
                    f"| {name.removesuffix(' live keys')} | {timing.median('ping'):.0f} | "
                    f"{timing.median('accepted'):.0f} | {timing.ratio('accepted', 'ping'):.2f} | "
                    f"{timing.median('duplicate'):.0f} | "
                    f"{timing.ratio('duplicate', 'ping'):.2f} |"
                )
        usage = scale["MEMORY USAGE"]
        lines += [
            "",
            "| memory per live key | bytes | target |",
            "|---|---:|---|",
            f"| queued record (MEMORY USAGE) | {usage['queued']} | "
            f"{verdict('memory per live key', usage['queued'])} |",
            f"| running record, {len(HOST)}-character host name (MEMORY USAGE) | "
            f"{usage['running']} | {verdict('memory per live key', usage['running'])} |",
            f"| used_memory / live keys, at the largest size | "
            f"{scale['used_memory per key']:.0f} | |",
            "",
        ]
    lines += _roundtrips(results.get("roundtrips"))
    lines += _greenlets(results.get("greenlets"))
    lines += _client(results.get("client"))
    lines += _flow(results.get("flow"))
    for name, summary in (("webview", webview.summary), ("reaper", reaper.summary)):
        if results.get(name):
            lines += summary(results[name])
    return "\n".join(lines)


def _worker(worker: Timings | None, pool: str) -> list[str]:
    if not worker:
        return []
    lines = [
        f"## Worker throughput ({pool}, no-op tasks)",
        "",
        f"Median of {len(worker.samples['plain'])} interleaved rounds, every variant's tasks "
        "drained by one worker; x plain is the median of the ratios within each round. The "
        "peers release their locks after each run, as dedupe does.",
        "",
        "| variant | tasks/s | x plain | target |",
        "|---|---:|---:|---|",
    ]
    for name in worker.samples:
        ratio = worker.ratio(name, "plain")
        target = verdict("worker throughput", ratio) if name == "dedupe" else ""
        lines.append(f"| {name} | {worker.median(name):.0f} | {ratio:.2f} | {target} |")
    return [*lines, ""]


def _roundtrips(trips: dict[str, tuple[float, float]] | None) -> list[str]:
    if not trips:
        return []
    lines = [
        "## Redis commands per call and per run (INFO commandstats)",
        "",
        "On the broker's Redis the message's LPUSH runs inside the script.",
        "",
        "| per | round trips | commands, with those inside scripts |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {top:.2f} | {total:.2f} |" for name, (top, total) in trips.items()]
    return [*lines, ""]


def _greenlets(greenlets: Timings | None) -> list[str]:
    if not greenlets:
        return []
    lines = [
        "## A call in a new greenlet (gevent, monkey-patched)",
        "",
        f"Median of {len(greenlets.samples[KEPT])} interleaved rounds, Store.enqueue of a new "
        "key; x kept is the median of the ratios within each round.",
        "",
        "| variant | us/call | x kept | target |",
        "|---|---:|---:|---|",
    ]
    for name in greenlets.samples:
        ratio = greenlets.ratio(name, KEPT)
        lines.append(
            f"| {name} | {greenlets.median(name):.0f} | {ratio:.2f} | {verdict(name, ratio)} |"
        )
    return [*lines, ""]


def _client(timings: Timings | None) -> list[str]:
    if not timings:
        return []
    lines = [
        "## The store's client per call",
        "",
        f"Median of {len(next(iter(timings.samples.values())))} interleaved rounds: one "
        "EVALSHA round trip (a duplicate's enqueue) through dedupe's client and through "
        "redis-py's own Script, with each of redis-py's parsers.",
        "",
        "| variant | us/call | x redis-py's Script (same parser) |",
        "|---|---:|---:|",
    ]
    for parser in client.PARSERS:
        reference = client.name(client.REDIS_PY, parser)
        for variant in (client.DEDUPE, client.REDIS_PY):
            label = client.name(variant, parser)
            ratio = timings.ratio(label, reference)
            lines.append(f"| {label} | {timings.median(label):.1f} | {ratio:.2f} |")
    return [*lines, ""]


def _flow(found: tuple[Timings, dict[str, float]] | None) -> list[str]:
    if not found:
        return []
    timings, server = found
    lines = [
        "## Flow control per key: each mode's call (Redis broker)",
        "",
        f"Median of {len(timings.samples[flow.PLAIN])} interleaved rounds; x plain is the "
        "median of the ratios within each round; server: EVALSHA's microseconds per call "
        "(INFO commandstats), over the mode's calls alone.",
        "",
        "| variant | us/call | x plain | server us/EVALSHA |",
        "|---|---:|---:|---:|",
    ]
    for name in timings.samples:
        ratio = timings.ratio(name, flow.PLAIN)
        on_server = f"{server[name]:.1f}" if name in server else ""
        lines.append(f"| {name} | {timings.median(name):.0f} | {ratio:.2f} | {on_server} |")
    return [*lines, ""]


def write(results: dict[str, Any], command: str) -> Path:
    RESULTS.mkdir(exist_ok=True)
    text = markdown(results, command)
    (RESULTS / "latest.md").write_text(text + "\n")
    _chart(results)
    return RESULTS / "latest.md"


def _chart(results: dict[str, Any]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    bars: dict[str, float] = {}
    enqueue = results.get("enqueue")
    if enqueue:
        bars.update(enqueue_ratios(enqueue))
    for kind, (pool, _) in WORKERS.items():
        worker = results.get(kind)
        for name in worker.samples if worker else ():
            if name != "plain":
                bars[f"{pool} worker ({name} / plain)"] = worker.ratio(name, "plain")
    if not bars:
        return
    figure, axes = plt.subplots(figsize=(9, 4.5))
    colors = ["#4c72b0" if "dedupe" in name else "#999999" for name in bars]
    axes.barh(list(bars), list(bars.values()), color=colors)
    axes.axvline(1.0, color="black", linewidth=0.8)
    axes.invert_yaxis()
    axes.set_xlabel("x plain apply_async (enqueue: time per call; worker: tasks per second)")
    axes.set_title("celery-dedupe: cost relative to plain Celery")
    figure.tight_layout()
    figure.savefig(RESULTS / "ratios.png", dpi=110)
    plt.close(figure)
