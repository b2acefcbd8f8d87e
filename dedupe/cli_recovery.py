"""``celery -A proj dedupe reap`` and ``purge``: free the keys of messages that are gone.

celery -A proj dedupe reap [--wait 5]        # two passes of the reaper, --wait s apart
celery -A proj dedupe purge [-Q a,b] --yes   # celery purge that frees what it purged
"""

from __future__ import annotations

import time

import click

from .cli_context import installed_app
from .runs.purging import purge
from .runs.reaping import Reaper
from .runs.runtime import runtime_of

__all__ = ["purge_queues", "reap"]


@click.command()
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Seconds between the round and the second look (at least 5 s, or the interval).",
)
@click.pass_context
def reap(ctx: click.Context, wait: float) -> None:
    """Free queued keys whose message is in no queue and held by no worker (two passes)."""
    runtime = runtime_of(installed_app(ctx))
    reaper = Reaper(runtime)
    # A round over every key (pass after pass, each a slice), then the suspects again.
    passes = [reaper.sweep()]
    while not reaper.round_done:
        passes.append(reaper.sweep())
    if any(found.blind for found in passes):
        raise click.ClickException(
            f"cannot look into the broker's queues ({runtime.broker.name} broker): nothing freed"
        )
    suspects = passes[-1].suspects
    second = passes[-1]
    if suspects:
        time.sleep(wait)
        second = reaper.sweep(keys=0)
    click.echo(
        f"{sum(found.candidates for found in passes)} queued keys older than "
        f"{runtime.config.reap_margin:g}s, {suspects} without a message, "
        f"{len(second.freed)} freed ({sum(found.keys_read for found in passes)} keys and "
        f"{sum(found.messages_read for found in passes)} messages read)"
    )
    for key in second.freed:
        click.echo(f"freed {key}")


@click.command(name="purge")
@click.option(
    "-Q",
    "--queues",
    help="Comma-separated queues (default: the app's task_queues, as celery purge).",
)
@click.option("--yes", is_flag=True, help="Do not ask before purging.")
@click.pass_context
def purge_queues(ctx: click.Context, queues: str | None, yes: bool) -> None:
    """Purge queues as `celery purge` does, and free the keys of the messages purged."""
    app = installed_app(ctx)
    names = (
        [q.strip() for q in queues.split(",") if q.strip()] if queues else sorted(app.amqp.queues)
    )
    if not yes:
        click.confirm(f"purge every message from {', '.join(names)}?", abort=True)
    done = purge(runtime_of(app), names)
    for name in names:
        click.echo(f"{name}: {done.messages[name]} messages purged")
    click.echo(f"{len(done.freed)} keys freed")
