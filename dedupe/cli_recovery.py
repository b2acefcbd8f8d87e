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
    help="Seconds between the two passes (at least the workers' report period, 5 s).",
)
@click.pass_context
def reap(ctx: click.Context, wait: float) -> None:
    """Free queued keys whose message is in no queue and held by no worker (two passes)."""
    runtime = runtime_of(installed_app(ctx))
    reaper = Reaper(runtime)
    first = reaper.sweep()
    if first.blind:
        raise click.ClickException(
            f"cannot look into the broker's queues ({runtime.broker.name} broker): nothing freed"
        )
    if first.suspects:
        time.sleep(wait)
        second = reaper.sweep()
    else:
        second = first
    click.echo(
        f"{first.candidates} queued keys older than {runtime.config.reap_margin:g}s, "
        f"{first.suspects} without a message, {len(second.freed)} freed "
        f"({first.keys_read} keys and {first.messages_read} messages read)"
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
