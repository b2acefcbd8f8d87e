"""A timeline picture per flow-control mode, drawn from a real run:
``python -m benchmarks.timelines`` (needs the bench extra: matplotlib).

Starts a throwaway redis-server (broker and dedup store) and a real ``celery worker -P prefork
-c 4`` on it, makes each mode's scripted calls (recording each call's time, task id and
argument), waits until every task id has run (each run records its start, end and the
argument it ran with: benchmarks/_timeline_tasks.py), and draws one PNG per mode into
docs/images/ (flow-debounce.png, flow-replace.png, flow-concurrency.png,
flow-rate-limit.png). The recorded times go to benchmarks/results/timelines.json;
``--draw-only`` redraws the pictures from that file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dedupe.demo.server import RedisServer

from ._env import ROOT, prefork_worker, stop_worker

IMAGES = ROOT / "docs" / "images"
DATA = Path(__file__).resolve().parent / "results" / "timelines.json"
COMMAND = "python -m benchmarks.timelines"


@dataclass(frozen=True)
class Call:
    """One scripted call: when (seconds after the first), its argument, its call options."""

    at: float
    value: int
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Mode:
    name: str  # the picture is docs/images/flow-<name>.png
    task: str  # its name in benchmarks/_timeline_tasks.py
    seconds: float  # how long each run lasts
    calls: list[Call]
    title: str
    subtitle: str


MODES = [
    Mode(
        "debounce",
        "debounced",
        0.4,
        [Call(round(0.3 * index, 1), index) for index in range(17)],
        "debounce=1, debounce_max_wait=3: a call every 0.3 s for 4.8 s",
        "A burst runs once, with its last call's argument: 3 s after its first call "
        "(max wait), or 1 s after its last (quiet)",
    ),
    Mode(
        "replace",
        "replaced",
        2.0,
        [
            Call(0.0, 0, {"countdown": 1}),
            Call(0.3, 1),
            Call(0.6, 2),
            Call(1.5, 3),
            Call(2.0, 4),
            Call(2.5, 5),
        ],
        'on_duplicate="replace", unique_until="started": 2 s runs',
        "Calls while queued (the first has countdown=1) replace its argument; calls during "
        "the run leave one follow-up run, with the last",
    ),
    Mode(
        "concurrency",
        "two_at_once",
        1.0,
        [Call(0.0, index) for index in range(6)],
        "key_concurrency=2: six calls of one key at once, 1 s runs, 4 pool processes",
        "Never more than two runs at once; the others wait their turn, in call order",
    ),
    Mode(
        "rate-limit",
        "two_per_second",
        0.3,
        [Call(0.0, index) for index in range(6)],
        'key_rate_limit="2/s": six calls of one key at once',
        "At most two starts per second: calls beyond it are published with a countdown "
        "to the next free start",
    ),
]


# -- the run ------------------------------------------------------------------------------


def play(mode: Mode) -> dict[str, Any]:
    """Make the mode's calls on time; wait until every task id has run. Times are seconds
    after the first call."""
    from . import _timeline_tasks

    task = getattr(_timeline_tasks, mode.task)
    calls = []
    origin = time.time()
    for call in mode.calls:
        time.sleep(max(0.0, origin + call.at - time.time()))
        at = time.time()
        result = task.apply_async(("k", call.value, mode.seconds), **call.options)
        calls.append(
            {
                "at": at - origin,
                "value": call.value,
                "id": result.id,
                "deduplicated": bool(result.deduplicated),
            }
        )
    ids = {call["id"] for call in calls}
    deadline = time.monotonic() + 60
    while {run["id"] for run in _timeline_tasks.runs(mode.name)} < ids:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{mode.name}: not every task id ran within 60 s")
        time.sleep(0.2)
    time.sleep(1.5)  # (a second run of one id would show)
    runs = [
        {**run, "start": run["start"] - origin, "end": run["end"] - origin}
        for run in _timeline_tasks.runs(mode.name)
    ]
    again = [{**sent, "at": sent["at"] - origin} for sent in _timeline_tasks.sent_again(mode.name)]
    return {"calls": calls, "runs": runs, "sent_again": again}


def record(modes: list[Mode]) -> dict[str, Any]:
    with RedisServer() as server:
        os.environ["DEDUPE_TIMELINES_REDIS"] = server.url
        from . import _timeline_tasks

        app, module = _timeline_tasks.app, "benchmarks._timeline_tasks"
        worker = prefork_worker(app, module, "timelines", _timeline_tasks.QUEUE, 4)
        try:
            recorded = {}
            for mode in modes:
                recorded[mode.name] = play(mode)
                print(f"{mode.name}: {len(recorded[mode.name]['runs'])} runs", flush=True)
            return recorded
        finally:
            stop_worker(worker)


# -- the pictures -------------------------------------------------------------------------


def lanes(runs: list[dict[str, Any]]) -> list[int]:
    """A lane per run (runs in start order): the first lane free at its start."""
    ends: list[float] = []
    found = []
    for run in runs:
        for lane, end in enumerate(ends):
            if end <= run["start"]:
                ends[lane] = run["end"]
                found.append(lane)
                break
        else:
            ends.append(run["end"])
            found.append(len(ends) - 1)
    return found


def groups(calls: list[dict[str, Any]], gap: float) -> list[list[dict[str, Any]]]:
    """Calls closer than ``gap`` seconds to the first of their group, together."""
    found: list[list[dict[str, Any]]] = []
    for call in sorted(calls, key=lambda call: call["at"]):
        if found and call["at"] - found[-1][0]["at"] < gap:
            found[-1].append(call)
        else:
            found.append([call])
    return found


def _span(ax: Any, lo: float, hi: float, y: float, text: str) -> None:
    """A double arrow from lo to hi at height y, its text above it, a dashed line down at hi."""
    ax.annotate("", (lo, y), (hi, y), arrowprops={"arrowstyle": "<->", "color": "0.4", "lw": 1})
    ax.text((lo + hi) / 2, y + 0.06, text, fontsize=8, color="0.3", ha="center", va="bottom")
    ax.plot([hi, hi], [y, -0.3], color="0.5", ls="--", lw=1, zorder=1)


def debounce_guides(ax: Any, data: dict[str, Any], y: float) -> float:
    """Per burst (task id), the deadline its run met: 3 s after its first call, or 1 s after
    its last."""
    bursts: dict[str, list[float]] = {}
    for call in data["calls"]:
        bursts.setdefault(call["id"], []).append(call["at"])
    right = 0.0
    for run in data["runs"]:
        times = bursts.get(run["id"])
        if not times:
            continue
        cap, quiet = min(times) + 3, max(times) + 1
        if cap <= quiet:
            _span(ax, min(times), cap, y, "max wait: 3 s after the first call")
        else:
            _span(ax, max(times), quiet, y, "quiet: 1 s after the last")
        right = max(right, min(cap, quiet))
    return right


def replace_guides(ax: Any, data: dict[str, Any], y: float) -> float:
    """The first call's countdown."""
    first = data["calls"][0]["at"]
    _span(ax, first, first + 1, y, "countdown=1")
    return first + 1


def period_guides(ax: Any, data: dict[str, Any], y: float) -> float:
    """Seconds from the first start: the periods, each of at most two starts."""
    first = min(run["start"] for run in data["runs"])
    last = max(run["start"] for run in data["runs"])
    second = 0
    while first + second <= last:
        lo = first + second
        ax.annotate("", (lo, y), (lo + 1, y), arrowprops={"arrowstyle": "<->", "color": "0.5"})
        ax.text(lo + 0.5, y + 0.06, "1 s: two starts at most", fontsize=8, color="0.3")
        ax.texts[-1].set(ha="center", va="bottom")
        ax.axvline(lo, color="0.55", ls=":", lw=1, zorder=0)
        second += 1
    ax.axvline(first + second, color="0.55", ls=":", lw=1, zorder=0)
    return first + second


GUIDES: dict[str, Callable[[Any, dict[str, Any], float], float]] = {
    "debounce": debounce_guides,
    "replace": replace_guides,
    "rate-limit": period_guides,
}


#: Heights, in row units (a lane is 1): a stacked call's step; the guides' row.
STEP = 0.3
GUIDE_ROW = 0.7
#: Inches: a row unit; the margins (titles above; axis and legend below; the lanes' names).
INCH_PER_ROW = 0.45
ABOVE, BELOW, LEFT, RIGHT = 0.7, 0.9, 1.0, 0.15


def _draw_runs(ax: Any, runs: list[dict[str, Any]], colors: dict[str, Any]) -> None:
    """One bar per run, in lanes (the first lane at the top), labelled with the argument it
    ran with."""
    lane_of = lanes(runs)
    count = max(lane_of) + 1
    for run, lane in zip(runs, lane_of, strict=True):
        y = count - 1 - lane
        width = run["end"] - run["start"]
        ax.barh(y, width, left=run["start"], height=0.6, color=colors[run["id"]], zorder=2)
        middle = run["start"] + width / 2
        ax.text(middle, y, str(run["value"]), ha="center", va="center", fontsize=9)
        ax.texts[-1].set(color="white", fontweight="bold", zorder=3)


def _draw_calls(
    ax: Any, stacked: list[list[dict[str, Any]]], colors: dict[str, Any], base: float, dx: float
) -> None:
    """A marker per call (stacked when made at once), labelled with its argument: filled for
    a call that made a task id, hollow for one answered with an earlier call's id."""
    for group in stacked:
        for index, call in enumerate(group):
            color = colors[call["id"]]
            face = "white" if call["deduplicated"] else color
            if len(group) == 1:
                y = base + 0.3
                ax.text(call["at"], y + 0.17, str(call["value"]), ha="center", fontsize=8)
            else:
                y = base + 0.15 + STEP * index
                ax.text(call["at"] + dx, y, str(call["value"]), va="center", fontsize=8)
            ax.plot(call["at"], y, "o", ms=7, mfc=face, mec=color, mew=1.6, zorder=3)


def _legend(fig: Any, calls: list[dict[str, Any]], again: bool) -> None:
    from matplotlib.lines import Line2D

    legend = [
        Line2D([], [], ls="", marker="o", mfc="0.4", mec="0.4", label="call (a new task id)"),
        Line2D(
            [], [], ls="", marker="o", mfc="white", mec="0.4", mew=1.6, label="call (an earlier id)"
        ),
        Line2D([], [], lw=6, color="0.4", label="run, with the argument it ran with"),
    ]
    if not any(call["deduplicated"] for call in calls):
        legend.pop(1)
    if again:
        label = "delivery sent again (same id)"
        mark = Line2D([], [], ls="", marker="x", mew=1.8, color="0.4", label=label)
        legend.insert(-1, mark)
    fig.legend(
        handles=legend,
        loc="lower right",
        ncols=len(legend),
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(1, 0),
        borderaxespad=0.3,
    )
    fig.text(0.01, 0.1 / fig.get_figheight(), "colour: one task id", fontsize=8, color="0.4")


def draw(mode: Mode, data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    calls, runs = data["calls"], data["runs"]
    palette = plt.get_cmap("tab10").colors
    colors: dict[str, Any] = {}
    for item in [*calls, *runs]:
        colors.setdefault(item["id"], palette[len(colors) % len(palette)])
    span = max([run["end"] for run in runs] + [call["at"] for call in calls]) + 0.3
    stacked = groups(calls, gap=span * 0.015)
    band = max(0.8, 0.3 + STEP * max(len(group) for group in stacked))
    guides = GUIDES.get(mode.name)
    count = len(set(lanes(runs)))
    again = groups(data.get("sent_again", []), gap=span * 0.015)
    again_base = count - 0.7 + (GUIDE_ROW if guides else 0.3)
    again_band = max(0.6, 0.2 + STEP * max(map(len, again))) if again else 0.0
    base = again_base + again_band
    rows = base + band + 0.6
    height = ABOVE + INCH_PER_ROW * rows + BELOW
    fig = plt.figure(figsize=(9, height), dpi=150)
    ax = fig.add_axes(
        (LEFT / 9, BELOW / height, 1 - (LEFT + RIGHT) / 9, INCH_PER_ROW * rows / height)
    )
    _draw_runs(ax, runs, colors)
    _draw_calls(ax, stacked, colors, base, dx=span * 0.008)
    ticks = {f"run {lane + 1}": count - 1 - lane for lane in range(count)}
    if again:
        ticks["sent again"] = again_base + again_band / 2
        for group in again:
            for index, sent in enumerate(group):
                y = ticks["sent again"] + STEP * (index - (len(group) - 1) / 2)
                color = colors.get(sent["id"], "0.4")
                ax.plot(sent["at"], y, "x", ms=6, mew=1.8, color=color, zorder=3)
        ax.axhline(again_base, color="0.85", lw=0.8)
    if guides:
        span = max(span, guides(ax, data, count - 0.7 + 0.2) + 0.1)
    ax.axhline(base, color="0.85", lw=0.8)
    ticks["calls"] = base + (0.3 if len(stacked[0]) == 1 else band / 2)
    ax.set_yticks(list(ticks.values()), list(ticks))
    ax.set_ylim(-0.6, base + band)
    ax.set_xlim(-0.25, span)
    ax.set_xlabel("seconds after the first call")
    ax.grid(axis="x", color="0.92", zorder=0)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.text(0.01, 1 - 0.1 / height, mode.title, fontsize=11, fontweight="bold", va="top")
    fig.text(0.01, 1 - 0.37 / height, mode.subtitle, fontsize=9, color="0.3", va="top")
    _legend(fig, calls, bool(again))
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    names = [mode.name for mode in MODES]
    parser.add_argument("--only", nargs="+", choices=names, default=names, help="run these")
    parser.add_argument("--draw-only", action="store_true", help=f"redraw from {DATA}")
    args = parser.parse_args(argv)
    modes = [mode for mode in MODES if mode.name in args.only]
    recorded = json.loads(DATA.read_text(encoding="utf-8")) if DATA.exists() else {}
    if not args.draw_only:
        recorded.update(record(modes))
        DATA.write_text(json.dumps(recorded, indent=1) + "\n", encoding="utf-8")
    IMAGES.mkdir(exist_ok=True)
    for mode in modes:
        path = IMAGES / f"flow-{mode.name}.png"
        draw(mode, recorded[mode.name], path)
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
