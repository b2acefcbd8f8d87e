"""The dedup store's URL, read without I/O: which servers it names and how they log in.

A Sentinel URL lists the sentinels, ``;``-separated; the password in it (if any) is the
master's, its path the database; the master's name and the sentinels' own settings come from
the options (for a ``sentinel://`` broker, from ``broker_transport_options``)::

    sentinel://:masterpass@10.0.0.1:26379/0;sentinel://10.0.0.2:26379;sentinel://10.0.0.3:26379
    dedupe_redis_options = {"master_name": "mymaster", "sentinel_kwargs": {"password": "s"}}

A Cluster URL lists one or more of its nodes, ``,``-separated (the rest are discovered); the
password in it (if any) is every node's; ``rediss+cluster://`` speaks TLS::

    redis+cluster://:pass@10.0.0.1:7000,10.0.0.2:7000
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from dedupe.errors import ConfigurationError

__all__ = [
    "CLUSTER_SCHEMES",
    "SENTINEL_OPTIONS",
    "SENTINEL_SCHEMES",
    "ClusterTarget",
    "SentinelTarget",
    "cluster_target",
    "redacted",
    "sentinel_target",
]

#: URL schemes of a Sentinel-managed master (Celery's, and redis-py users' spelling).
SENTINEL_SCHEMES = ("sentinel://", "sentinel+ssl://", "redis+sentinel://")
#: URL schemes of a Redis Cluster (any of its nodes, ``,``-separated).
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
#: Options that configure the Sentinel lookup, not the master's connections.
SENTINEL_OPTIONS = ("master_name", "sentinel_kwargs")


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    """Where a Redis Cluster is found, and how its connections log in."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    ssl: bool = False


def cluster_target(url: str) -> ClusterTarget | None:
    """The Cluster a URL names, or None for a URL of anything else.

    >>> cluster_target("redis+cluster://:pw@h1:7000,h2:7001/0")
    ClusterTarget(nodes=(('h1', 7000), ('h2', 7001)), username=None, password='pw', ssl=False)
    """
    if not url.startswith(CLUSTER_SCHEMES):
        return None
    scheme, _, rest = url.partition("://")
    rest, _, query = rest.partition("?")
    if query:
        raise ConfigurationError(
            f"a Cluster URL takes no query ({redacted(url)!r}): give connection options in "
            f"dedupe_redis_options, e.g. {{'ssl_cert_reqs': 'none'}}"
        )
    # The credentials and the database are written once, around the list of nodes.
    credentials, _, hosts = rest.rpartition("@")
    hosts, _, path = hosts.partition("/")
    if path.strip("/") not in ("", "0"):
        raise ConfigurationError(
            f"a Redis Cluster has only database 0: {path!r} in {redacted(url)!r}"
        )
    nodes: list[tuple[str, int]] = []
    for host in hosts.split(","):
        name, colon, port = host.strip().rpartition(":")
        if not colon:
            name, port = port, ""
        try:
            nodes.append((name.strip("[]") or "localhost", int(port) if port else 6379))
        except ValueError:
            raise ConfigurationError(
                f"a Cluster URL's nodes are host:port: {host!r} in {redacted(url)!r}"
            ) from None
    if not hosts.strip():
        raise ConfigurationError(f"a Cluster URL names at least one node: {redacted(url)!r}")
    username, _, password = credentials.partition(":")
    return ClusterTarget(
        tuple(nodes),
        unquote(username) or None,
        unquote(password) or None,
        ssl=scheme == "rediss+cluster",
    )


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """Where a Sentinel-managed master is found, and how its connections log in."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl: bool = False


def sentinel_target(url: str, options: Mapping[str, object]) -> SentinelTarget | None:
    """The Sentinel target a URL names, or None for a URL of one server.

    >>> sentinel_target("sentinel://:pw@h1:26379/2;sentinel://h2", {"master_name": "m"})
    SentinelTarget(sentinels=(('h1', 26379), ('h2', 26379)), master_name='m', db=2, \
username=None, password='pw', ssl=False)
    """
    if not url.startswith(SENTINEL_SCHEMES):
        return None
    sentinels: list[tuple[str, int]] = []
    username = password = None
    db = 0
    for part in url.split(";"):
        part = part.strip()
        if not part:
            continue
        parsed = urlsplit(part)
        sentinels.append((parsed.hostname or "localhost", parsed.port or 26379))
        username = username or (unquote(parsed.username) if parsed.username else None)
        password = password or (unquote(parsed.password) if parsed.password else None)
        path = parsed.path.strip("/")
        if path:
            try:
                db = int(path)
            except ValueError:
                raise ConfigurationError(
                    f"the database in a Sentinel URL is a number: {path!r} in {redacted(part)!r}"
                ) from None
    master_name = options.get("master_name")
    if not isinstance(master_name, str) or not master_name:
        raise ConfigurationError(
            "a sentinel:// dedup URL needs the name of the master the sentinels watch: "
            "dedupe_redis_options={'master_name': 'mymaster'} (for a sentinel:// broker, "
            "broker_transport_options={'master_name': 'mymaster'}, which the store reads too)"
        )
    return SentinelTarget(
        tuple(sentinels),
        master_name,
        db,
        username,
        password,
        ssl=url.startswith("sentinel+ssl://"),
    )


def redacted(url: object) -> str:
    """A URL as error messages show it: its password (everything before the ``@``) hidden."""
    text = str(url)
    if "@" in text and "://" in text:
        scheme, rest = text.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return text
