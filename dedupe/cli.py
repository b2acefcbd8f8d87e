"""``celery -A proj dedupe ...``: see and clear dedup keys.

    celery -A proj dedupe list [--task NAME] [--limit N]     # NAME exactly, never a prefix
    celery -A proj dedupe stats [--task NAME]                # live keys by task and state
    celery -A proj dedupe show TASK [--args JSON] [--kwargs JSON]
    celery -A proj dedupe clear TASK [--args JSON] [--kwargs JSON]
    celery -A proj dedupe clear --task NAME --yes        # every key of one task
    celery -A proj dedupe clear --all --yes              # every key under the prefix
    celery -A proj dedupe check                          # ok/warn/FAIL lines; exit 1 on a FAIL
    celery -A proj dedupe reap | purge [-Q QUEUES] --yes # free keys of gone messages
    celery -A proj dedupe web [--host 127.0.0.1] [--port 9808] [--allow-clear] [--allowed-host NAME]

Listing scans (never KEYS): it is for people, not code paths. Errors are one line (exit 1;
an unknown task name is a usage error, exit 2), never a traceback.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import click
import click.core
import redis
import redis.cluster
from celery import Celery

from .cli_context import installed_app as _app
from .cli_context import loaded_app as _loaded
from .cli_lines import echo_waiting, waiting_line, waiting_of
from .errors import DedupeError, NotInstalled, RecordFormatError, RedisUnavailable
from .producer import guard
from .producer.guard import lookup
from .runs.inventory import live_key_counts, scan
from .runs.run import acks_late_leases
from .runs.runtime import Runtime, add_runtime, installed
from .store.checks import Verdict, acl_check, eviction_check, servers_of, version_check
from .store.clients import DedupRedis
from .store.redis_errors import redis_errors
from .values.keys import reaper_keys
from .values.record import Holder
from .values.urls import redacted

# The web view is an optional extra (starlette, uvicorn): without it, the other commands work
# and `web` says what to install. (Its import costs the process's start ~30 ms, once.)
_web_serve: Callable[..., None] | None
try:
    from .webview.server import serve as _web_serve
except ModuleNotFoundError as _missing:
    if (_missing.name or "").partition(".")[0] not in ("starlette", "uvicorn"):
        raise
    _web_serve, _web_missing = None, _missing.name

__all__ = ["dedupe"]


#: "The dedup Redis cannot answer": what a command reports in one line, not a traceback.
_UNREACHABLE: tuple[type[BaseException], ...] = (RedisUnavailable, *redis_errors)


class _OneLineErrors(click.Group):
    """The ``dedupe`` group: a Redis that is down, or refuses, ends a command in one line
    naming it (exit 1), as a ``click.ClickException``."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except _UNREACHABLE as exc:
            raise click.ClickException(_unreachable(ctx, exc)) from None
        except redis.ResponseError as exc:  # (NOPERM and the like: waiting does not fix it)
            raise click.ClickException(
                f"the dedup Redis at {_url(ctx)} refused a command ({type(exc).__name__}: "
                f"{exc}): `celery dedupe check` names what the user may not run"
            ) from None
        except DedupeError as exc:  # settings, a refused command: the error names the fix
            raise click.ClickException(str(exc)) from None


def _unreachable(ctx: click.Context, exc: BaseException) -> str:
    cause = exc.cause if isinstance(exc, RedisUnavailable) else exc
    what = f"({type(cause).__name__}: {cause})"
    if isinstance(cause, redis.AuthenticationError):
        return (
            f"the dedup Redis at {_url(ctx)} refused the login {what}: fix the user and "
            f"password in dedupe_redis_url"
        )
    return (
        f"cannot reach the dedup Redis at {_url(ctx)} {what}: start it, or point "
        f"dedupe_redis_url at a running one"
    )


def _url(ctx: click.Context) -> str:
    """The dedup Redis's URL, its password hidden (error messages show it)."""
    runtime = installed(getattr(ctx.obj, "app", None))
    try:
        return redacted(runtime.config.redis_url) if runtime else "(no dedup Redis URL)"
    except DedupeError:  # (settings that do not parse: the error names them)
        return "(no dedup Redis URL)"


def _require_known(app: Celery, task: str, param: str) -> None:
    """Refuse a task name that is neither registered nor in any live key: a typo would
    otherwise read as "no keys" or "free"."""
    if task in app.tasks or next(_scan(app, task), None) is not None:
        return
    close = difflib.get_close_matches(task, list(app.tasks), n=3)
    hint = f"did you mean: {', '.join(close)}?" if close else "is -A the app that registers it?"
    raise click.BadParameter(
        f"no task {task!r} in app {app.main!r}, and no live key of that name; {hint}",
        param_hint=param,
    )


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


def _suspects(app: Celery) -> dict[str, float]:
    runtime = installed(app)
    assert runtime is not None
    return runtime.store.suspects(reaper_keys(runtime.config.key_prefix)[1])


def _line(holder: Holder) -> str:
    ttl = "-" if holder.ttl is None else f"{holder.ttl:.0f}s"
    since = ""
    started = holder.started_at if holder.state == "running" else holder.enqueued_at
    if started:
        since = f"{time.time() - started:.0f}s ago"
    where = f" on {holder.worker}" if holder.worker else ""
    state = "provisional" if holder.provisional else holder.state
    return f"{state:<11} {ttl:>7} {since:>10}  {holder.task_id:<36}  {holder.key}{where}"


_HEADER = f"{'state':<11} {'ttl':>7} {'since':>10}  {'task id':<36}  key"


@click.group(name="dedupe", cls=_OneLineErrors)
def dedupe() -> None:
    """See and clear celery-dedupe's keys."""


@dedupe.command(name="list")
@click.option("--task", help="Only the keys of this task name.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.pass_context
def list_keys(ctx: click.Context, task: str | None, limit: int) -> None:
    """List live keys: state, time to live, holder's task id, key."""
    app = _app(ctx)
    if task is not None:
        _require_known(app, task, "--task")
    shown = 0
    gone = _suspects(app)
    for name, raw, pttl in _scan(app, task):
        if not shown:
            click.echo(_HEADER)
        if shown == limit:
            click.echo("... more (raise --limit)")
            return
        try:
            line = _line(Holder.from_raw(name, raw, pttl))
            # (Found without its message by the reaper's last pass: freed by its next.)
            click.echo(line + ("  (no message)" if name in gone else ""))
        except RecordFormatError as exc:
            # Say so and go on: one stray key must not hide the others.
            click.echo(f"unknown  {exc}")
        shown += 1
    shown += echo_waiting(app, task, limit - shown)
    if not shown:
        click.echo("no live keys" + (f" for {task}" if task else ""))


def _call(ctx: click.Context, task: str, args: str | None, kwargs: str | None) -> dict[str, Any]:
    call_args, call_kwargs = _json("--args", args, list), _json("--kwargs", kwargs, dict)
    app = _app(ctx)
    _require_known(app, task, "TASK")
    return {
        "task_or_name": app.tasks.get(task) or task,
        "args": call_args,
        "kwargs": call_kwargs,
        "app": app,
    }


@dedupe.command()
@click.argument("task")
@click.option("--args", help="Positional arguments, as a JSON list.")
@click.option("--kwargs", help="Keyword arguments, as a JSON object.")
@click.pass_context
def show(ctx: click.Context, task: str, args: str | None, kwargs: str | None) -> None:
    """Show who holds the key of a call of TASK."""
    call = _call(ctx, task, args, kwargs)
    holder = lookup(**call)
    waiting = waiting_of(call["app"], call["task_or_name"], call["args"], call["kwargs"])
    if holder is None and not waiting:
        click.echo("free: no task holds this call's key")
    if holder is not None:
        click.echo(_line(holder))
    for entry in waiting:
        click.echo(waiting_line(entry))


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
        call = _call(ctx, task, args, kwargs)
        holder = lookup(**call)
        cleared = guard.clear(**call)
        click.echo("cleared 1 key" if cleared else "nothing to clear: the key is free")
        if cleared and holder is not None and holder.state == "running":
            click.echo(_RUN_GOES_ON.format(count="its run"))
        return
    app = _app(ctx)
    if every_of_task is not None:
        _require_known(app, every_of_task, "--task")
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
    app = _app(ctx)
    if task is not None:
        _require_known(app, task, "--task")
    counts = live_key_counts(app, task)
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
    """Check the app and its dedup Redis, one ok/warn/FAIL line each; exit 1 on a FAIL."""
    app = _loaded(ctx)
    failed = []
    for name, verdict in _verdicts(app):
        status, said = verdict
        click.echo(f"{status:<4}  {name}: {said}")
        if status == "FAIL":
            failed.append(name)
    if failed:
        plural = "s" if len(failed) > 1 else ""
        raise click.ClickException(f"{len(failed)} check{plural} failed: {', '.join(failed)}")


def _verdicts(app: Celery) -> Iterator[tuple[str, Verdict]]:
    """Each check's name and verdict, as it is made (a slow Redis shows where it is)."""
    runtime = installed(app)
    if runtime is None:
        yield "installed", ("FAIL", str(NotInstalled(str(app.main))))
        runtime = add_runtime(app)
    else:
        yield "installed", ("ok", f"dedupe.install(app) was called for app {app.main!r}")
    client = runtime.store.client
    reach = _reach(runtime, client)
    yield "redis", reach
    if reach[0] == "ok":  # (the next three ask the server)
        servers = servers_of(client)
        yield "version", version_check(servers)
        yield "eviction", eviction_check(client)
        queue = str(app.conf.task_default_queue) if runtime.broker_is_store else None
        yield "acl", acl_check(servers[0], runtime.config.key_prefix, queue)
    yield "visibility", _visibility(app, runtime)


def _reach(runtime: Runtime, client: DedupRedis) -> Verdict:
    config = runtime.config
    url = redacted(config.redis_url)
    try:
        client.ping()
    except _UNREACHABLE as exc:
        cause = exc.cause if isinstance(exc, RedisUnavailable) else exc
        return "FAIL", (
            f"cannot reach the dedup Redis at {url} ({type(cause).__name__}: {cause}): "
            f"start it, or point dedupe_redis_url at a running one"
        )
    return "ok", f"{url} (prefix {config.key_prefix!r}) is reachable"


def _visibility(app: Celery, runtime: Runtime) -> Verdict:
    """Would a dead worker's acks_late run hold its key far beyond its lease?"""
    try:
        tasks = acks_late_leases(app, runtime.config)
    except DedupeError as exc:  # a task's dedup options are invalid
        return "FAIL", str(exc)
    if not tasks or runtime.broker.redelivery is None:
        return "ok", "no acks_late dedup task on a Redis broker"
    warning = runtime.broker.redelivery_warning(tasks)
    if warning:
        return "warn", warning
    return "ok", "the Redis broker gives a dead worker's acks_late messages back within the lease"


@dedupe.command()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    envvar="DEDUPE_WEB_HOST",
    help="Address to listen on. One other machines reach must be given here, by --host.",
)
@click.option("--port", type=click.IntRange(0, 65535), default=9808, show_default=True)
@click.option(
    "--allow-clear",
    is_flag=True,
    help="Offer a clear button per key (behind a token printed at start, and CSRF checks).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="A name the view is reached under besides loopback names and --host (repeatable); "
    "a request whose Host header names no such name gets 400 (DNS rebinding).",
)
@click.pass_context
def web(
    ctx: click.Context, host: str, port: int, allow_clear: bool, allowed_hosts: tuple[str, ...]
) -> None:
    """Serve a live web view of the keys (pip install 'celery-dedupe[web]')."""
    if not _is_loopback(host):
        source = ctx.get_parameter_source("host")
        if source is not click.core.ParameterSource.COMMANDLINE:
            # A variable left in an environment must not open the view to the network.
            raise click.UsageError(
                f"refusing to listen on {host} (from DEDUPE_WEB_HOST), which other machines "
                f"reach: give --host {host} on the command line to mean it"
            )
    serve = _web_server()
    app = _app(ctx)
    runtime = installed(app)
    assert runtime is not None
    config = runtime.config
    if not _is_loopback(host) and config.web_token is None and config.web_basic_auth is None:
        click.echo(
            f"warning: listening on {host} without credentials: anyone who reaches the port "
            f"sees the keys; set dedupe_web_token or dedupe_web_basic_auth",
            err=True,
        )
    serve(
        app,
        host=host,
        port=port,
        allow_clear=allow_clear,
        allowed_hosts=allowed_hosts,
        say=click.echo,
    )


def _is_loopback(host: str) -> bool:
    """Does only this machine reach ``host``?

    >>> [_is_loopback(host) for host in ("127.0.0.1", "::1", "localhost", "0.0.0.0")]
    [True, True, True, False]
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _web_server() -> Callable[..., None]:
    """The web server's entry point, or a clear error where the ``web`` extra is missing."""
    if _web_serve is None:
        raise click.ClickException(
            f"celery dedupe web needs {_web_missing}, which the web extra installs: "
            f"pip install 'celery-dedupe[web]'"
        )
    return _web_serve


# (Defined apart: this module holds the commands that read keys.)
from .cli_recovery import purge_queues, reap  # noqa: E402

dedupe.add_command(reap)
dedupe.add_command(purge_queues)
