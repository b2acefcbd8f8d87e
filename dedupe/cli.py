"""``celery -A proj dedupe ...``: see and clear dedup keys.

    celery -A proj dedupe list [--task NAME] [--limit N]     # NAME exactly, never a prefix
    celery -A proj dedupe stats [--task NAME]                # live keys by task and state
    celery -A proj dedupe show TASK [--args JSON] [--kwargs JSON]
    celery -A proj dedupe clear TASK [--args JSON] [--kwargs JSON]
    celery -A proj dedupe clear --task NAME --yes        # every key of one task
    celery -A proj dedupe clear --all --yes              # every key under the prefix
    celery -A proj dedupe check                          # reachable? will it evict keys?

Listing scans the keyspace (SCAN, never KEYS): it is for people, not for code paths.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import click
from celery import Celery

from .errors import DedupeError, RecordFormatError
from .installer import install
from .producer import guard
from .producer.guard import lookup
from .runs.inventory import live_key_counts, scan
from .runs.runtime import installed
from .store.checks import eviction_risk
from .values.record import Holder

__all__ = ["dedupe"]


def _app(ctx: click.Context) -> Celery:
    app: Celery | None = getattr(ctx.obj, "app", None)
    if app is None:
        raise click.UsageError("no Celery app: run as `celery -A proj dedupe ...`")
    if installed(app) is None:
        install(app)
    return app


def _json(option: str, text: str | None, kind: type) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"not JSON ({exc.msg} at column {exc.colno})", param_hint=option
        ) from None
    if not isinstance(value, kind):
        expected = (
            "a JSON list, like '[42, \"eu\"]'"
            if kind is list
            else "a JSON object, like '{\"full\": true}'"
        )
        raise click.BadParameter(f"must be {expected}", param_hint=option)
    return value


def _scan(app: Celery, task: str | None) -> Iterator[tuple[str, bytes, int]]:
    """Every live key under the prefix (of exactly one task): its name, value and pttl."""
    runtime = installed(app)
    assert runtime is not None
    return scan(runtime.store.client, runtime.config.key_prefix, task)


def _line(holder: Holder) -> str:
    ttl = "-" if holder.ttl is None else f"{holder.ttl:.0f}s"
    since = ""
    started = holder.started_at if holder.state == "running" else holder.enqueued_at
    if started:
        since = f"{time.time() - started:.0f}s ago"
    where = f" on {holder.worker}" if holder.worker else ""
    state = "provisional" if holder.provisional else holder.state
    return f"{state:<11} {ttl:>7} {since:>10}  {holder.task_id}  {holder.key}{where}"


@click.group(name="dedupe")
def dedupe() -> None:
    """See and clear celery-dedupe's keys."""


@dedupe.command(name="list")
@click.option("--task", help="Only the keys of this task name.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.pass_context
def list_keys(ctx: click.Context, task: str | None, limit: int) -> None:
    """List live keys: state, time to live, holder's task id, key."""
    shown = 0
    for name, raw, pttl in _scan(_app(ctx), task):
        if shown == limit:
            click.echo("... more (raise --limit)")
            return
        try:
            click.echo(_line(Holder.from_raw(name, raw, pttl)))
        except RecordFormatError as exc:
            # Say so and go on: one stray key must not hide the others.
            click.echo(f"unknown  {exc}")
        shown += 1
    if not shown:
        click.echo("no live keys" + (f" for {task}" if task else ""))


def _call(ctx: click.Context, task: str, args: str | None, kwargs: str | None) -> dict[str, Any]:
    app = _app(ctx)
    return {
        "task_or_name": app.tasks.get(task) or task,
        "args": _json("--args", args, list),
        "kwargs": _json("--kwargs", kwargs, dict),
        "app": app,
    }


@dedupe.command()
@click.argument("task")
@click.option("--args", help="Positional arguments, as a JSON list.")
@click.option("--kwargs", help="Keyword arguments, as a JSON object.")
@click.pass_context
def show(ctx: click.Context, task: str, args: str | None, kwargs: str | None) -> None:
    """Show who holds the key of a call of TASK."""
    try:
        holder = lookup(**_call(ctx, task, args, kwargs))
    except DedupeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(_line(holder) if holder else "free: no task holds this call's key")


@dedupe.command()
@click.argument("task", required=False)
@click.option("--args", help="Positional arguments, as a JSON list.")
@click.option("--kwargs", help="Keyword arguments, as a JSON object.")
@click.option("--task", "every_of_task", metavar="NAME", help="Clear every key of this task.")
@click.option("--all", "everything", is_flag=True, help="Clear every key under the prefix.")
@click.option("--yes", is_flag=True, help="Do not ask before clearing many keys.")
@click.pass_context
def clear(
    ctx: click.Context,
    task: str | None,
    args: str | None,
    kwargs: str | None,
    every_of_task: str | None,
    everything: bool,
    yes: bool,
) -> None:
    """Clear the key of one call of TASK, or many keys (--task NAME, --all).

    A run that still holds a cleared key goes on; its heartbeat re-creates the key.
    """
    if sum(map(bool, (task, every_of_task, everything))) != 1:
        raise click.UsageError("give exactly one of: TASK (one call), --task NAME, --all")
    if task:
        try:
            call = _call(ctx, task, args, kwargs)
            holder = lookup(**call)
            cleared = guard.clear(**call)
        except DedupeError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo("cleared 1 key" if cleared else "nothing to clear: the key is free")
        if cleared and holder is not None and holder.state == "running":
            click.echo(_RUN_GOES_ON.format(count="its run"))
        return
    app = _app(ctx)
    what = f"every key of {every_of_task}" if every_of_task else "every dedup key"
    if not yes:
        click.confirm(f"Clear {what}?", abort=True)
    keys: list[str] = []
    running = 0
    for name, raw, pttl in _scan(app, every_of_task):
        keys.append(name)
        running += _is_running(name, raw, pttl)
    runtime = installed(app)
    assert runtime is not None
    for start in range(0, len(keys), 500):
        runtime.store.client.delete(*keys[start : start + 500])
    click.echo(f"cleared {len(keys)} key{'s' if len(keys) != 1 else ''}")
    if running:
        click.echo(_RUN_GOES_ON.format(count=f"{running} of them held by running tasks"))


_RUN_GOES_ON = (
    "note: {count}: a run goes on after its key is cleared, and its heartbeat writes the "
    "key again within a third of its lease"
)


def _is_running(key: str, raw: bytes, pttl: int) -> bool:
    try:
        return Holder.from_raw(key, raw, pttl).state == "running"
    except RecordFormatError:
        return False


@dedupe.command()
@click.option("--task", help="Only the keys of this task name.")
@click.pass_context
def stats(ctx: click.Context, task: str | None) -> None:
    """Count live keys by task and state."""
    counts = live_key_counts(_app(ctx), task)
    if not counts:
        click.echo("no live keys" + (f" for {task}" if task else ""))
        return
    states = ("queued", "running", "provisional")
    tasks = sorted({name for name, _ in counts})
    width = max(len("task"), *map(len, tasks))
    click.echo(f"{'task':<{width}}  " + "  ".join(f"{state:>11}" for state in states))
    for name in tasks:
        row = "  ".join(f"{counts[name, state]:>11}" for state in states)
        click.echo(f"{name:<{width}}  {row}")
    totals = "  ".join(
        f"{sum(count for (_, st), count in counts.items() if st == state):>11}" for state in states
    )
    click.echo(f"{'total':<{width}}  {totals}")


@dedupe.command()
@click.pass_context
def check(ctx: click.Context) -> None:
    """Check that the dedup Redis answers and will not evict live keys."""
    runtime = installed(_app(ctx))
    assert runtime is not None
    config = runtime.config
    client = runtime.store.client
    try:
        client.ping()
    except Exception as exc:
        raise click.ClickException(
            f"dedup Redis unreachable at {config.redis_url}: {exc}"
        ) from None
    click.echo(f"dedup Redis: {config.redis_url} (prefix {config.key_prefix!r}): reachable")
    warning = eviction_risk(client)
    if warning:
        raise click.ClickException(warning)
    click.echo("eviction: live keys are safe")
