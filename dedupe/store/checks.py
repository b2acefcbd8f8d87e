"""Checks of the dedup Redis, for the worker's start and ``celery dedupe check``: will it keep
our keys until they expire, is it new enough, may the connected user run what we send?

Every key celery-dedupe writes carries a TTL, so under a memory limit both ``allkeys-*``
and ``volatile-*`` eviction policies may drop live keys: a dropped queued record lets a
duplicate in, a dropped running record is re-created by the heartbeat only after the fact.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
import redis.cluster

from .clients import DedupRedis
from .redis_errors import redis_errors

__all__ = [
    "NEEDED_COMMANDS",
    "Verdict",
    "acl_check",
    "eviction_check",
    "eviction_risk",
    "servers_of",
    "version_check",
    "version_verdict",
]

#: A check's verdict: ``ok``, ``warn`` or ``FAIL``, and what it found (with the fix).
Verdict = tuple[str, str]

logger = logging.getLogger("dedupe.checks")

_CHECK_ERRORS: tuple[type[BaseException], ...] = (redis.ResponseError, *redis_errors)


def eviction_risk(client: DedupRedis) -> str | None:
    """A warning if the server (on a Redis Cluster: any master) may evict dedup keys, else
    None (also when it cannot tell)."""
    for server in servers_of(client):
        warning = _eviction_risk(server)
        if warning is not None:
            return warning
    return None


def _eviction_risk(server: Any) -> str | None:
    try:
        config = server.config_get("maxmemory*")
    except _CHECK_ERRORS as exc:
        # Managed Redis often disables CONFIG: nothing to check.
        logger.debug("cannot read the eviction settings of the dedup Redis: %r", exc)
        return None
    maxmemory = int(config.get("maxmemory", 0) or 0)
    policy = config.get("maxmemory-policy", "noeviction")
    if maxmemory == 0 or policy == "noeviction":
        return None
    return (
        f"the dedup Redis evicts keys under memory pressure (maxmemory={maxmemory}, "
        f"maxmemory-policy={policy}): dedup keys all carry a TTL and may be evicted while "
        f"live, letting duplicates in. Use maxmemory-policy noeviction, or a Redis of its "
        f"own (dedupe_redis_url)."
    )


def servers_of(client: DedupRedis) -> list[Any]:
    """The server (on a Redis Cluster: each master) as a plain client."""
    if isinstance(client, redis.cluster.RedisCluster):
        cluster: Any = client  # (the cluster client's node API is untyped)
        return [cluster.get_redis_connection(node) for node in cluster.get_primaries()]
    return [client]


def version_check(servers: list[Any]) -> Verdict:
    try:
        versions = [str(server.info("server").get("redis_version", "")) for server in servers]
    except redis.ResponseError as exc:  # (a managed Redis may refuse INFO)
        return "warn", f"not checked: the server refuses INFO ({exc}); it must be Redis >= 6.0"
    return version_verdict(min(versions, key=_version_tuple))


def _version_tuple(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in version.split(".")[:3])
    except ValueError:
        return ()


def version_verdict(version: str) -> Verdict:
    """A Redis version as docs/production.md judges it: the scripts need 6.0 (``SET ...
    KEEPTTL``); the tests run on 6.2 and 7."""
    number = _version_tuple(version)
    if not number:
        return "warn", f"cannot read the server's version ({version!r}); it must be >= 6.0"
    if number < (6, 0):
        return "FAIL", (
            f"Redis {version}: celery-dedupe needs Redis 6.0 or newer (its scripts write "
            f"with SET ... KEEPTTL); upgrade the server"
        )
    if number < (6, 2):
        return "warn", f"Redis {version}: untested (the tests run on 6.2 and 7); upgrade to 6.2+"
    return "ok", f"Redis {version}"


def eviction_check(client: DedupRedis) -> Verdict:
    try:
        client.config_get("maxmemory-policy")
    except redis.ResponseError as exc:  # (eviction_risk says nothing then: say it here)
        return "warn", (
            f"not checked: the server refuses CONFIG GET ({exc}); make sure its "
            f"maxmemory-policy is noeviction (a managed Redis sets it in its console)"
        )
    warning = eviction_risk(client)
    if warning:
        return "FAIL", warning
    return "ok", "live keys are safe (no memory limit, or maxmemory-policy noeviction)"


#: What celery-dedupe sends (docs/production.md, "An ACL user"); TIME, LPUSH, EXISTS and
#: PEXPIRE only from its scripts, which need them allowed all the same.
NEEDED_COMMANDS = (
    "EVALSHA", "SCRIPT LOAD", "GET", "SET", "DEL", "EXISTS", "PEXPIRE", "PTTL", "SCAN", "TIME",
    "LPUSH", "HGET", "HSET", "HDEL", "INCR", "ZADD", "ZCARD", "ZRANGE", "ZRANGEBYSCORE", "ZRANK",
    "ZREM", "ZREMRANGEBYSCORE", "ZSCORE",
)  # fmt: skip


def acl_check(server: Any, prefix: str, queue: str | None) -> Verdict:
    """Are the needed commands allowed to the connected user, on keys under ``prefix``?
    ``queue``: the broker's default queue, when the dedup Redis is the broker (a script
    pushes the message there)."""
    key = f"{prefix}:{{dedupe-check}}:probe"  # (no record ever has this name)
    # Harmless forms: a missing script, one that does not compile, a key no one uses.
    tries = {
        "EVALSHA": ["EVALSHA", "0" * 40, "1", key],
        "SCRIPT LOAD": ["SCRIPT", "LOAD", "("],
        "GET": ["GET", key],
        "SET": ["SET", key, "", "XX"],
        "DEL": ["DEL", key],
        "EXISTS": ["EXISTS", key],
        "PEXPIRE": ["PEXPIRE", key, "1"],
        "PTTL": ["PTTL", key],
        "SCAN": ["SCAN", "0", "MATCH", key, "COUNT", "1"],
        "TIME": ["TIME"],
    }
    if queue is not None:  # (the one-step path pushes the message from a script)
        tries["LPUSH"] = ["LPUSH", queue, ""]
    user = _user(server)
    denied = _dry_run(server, user, tries)
    unchecked = ""
    if denied is None:  # no ACL DRYRUN (before Redis 7, or not this user's to run)
        writes = tries.pop("LPUSH", None)
        refusals = (_refusal(server, name, argv) for name, argv in tries.items())
        denied = [refused for refused in refusals if refused is not None]
        unchecked = " (LPUSH not tried: it would write to the queue)" if writes else ""
    if denied:
        return "FAIL", _acl_fix(user, prefix, denied)
    if unchecked:
        return "warn", f"user {user!r} may run the commands celery-dedupe sends{unchecked}"
    return "ok", f"user {user!r} may run every command celery-dedupe sends"


def _user(server: Any) -> str:
    try:
        return str(server.acl_whoami())
    except redis.ResponseError:  # (not this user's to run, or no ACL: the URL's user)
        return str(server.connection_pool.connection_kwargs.get("username") or "default")


def _dry_run(server: Any, user: str, tries: dict[str, list[str]]) -> list[str] | None:
    """The commands (or ``key``) ACL DRYRUN denies, or None when it cannot be run."""
    denied: list[str] = []
    for name, argv in tries.items():
        try:
            reply = server.execute_command("ACL", "DRYRUN", user, *argv)
        except redis.ResponseError:
            return None
        text = reply.decode() if isinstance(reply, bytes) else str(reply)
        if text != "OK":
            denied.append("key" if "key" in text.lower() else name)
    return denied


def _refusal(server: Any, name: str, argv: list[str]) -> str | None:
    """``name`` (or ``key``) if the server refuses ``argv`` to this user, else None: any
    other error (no such script, a script that does not compile) means it ran it."""
    try:
        server.execute_command(*argv)
    except redis.exceptions.NoPermissionError as exc:
        return "key" if "key" in str(exc).lower() else name
    except redis.ResponseError:
        return None
    return None


def _acl_fix(user: str, prefix: str, denied: list[str]) -> str:
    commands = [name for name in denied if name != "key"]
    said = []
    if commands:
        rules = " ".join("+" + name.lower().replace(" ", "|") for name in commands)
        them = "it" if len(commands) == 1 else "them"
        said.append(
            f"user {user!r} may not run: {', '.join(commands)}; allow {them}: "
            f"ACL SETUSER {user} {rules}"
        )
    if "key" in denied:
        said.append(
            f"user {user!r} may not use the keys under the prefix; allow them: "
            f"ACL SETUSER {user} '~{prefix}:*'"
        )
    return "; ".join(said)
