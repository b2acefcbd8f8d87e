"""Which Redis server and database a connection names: one answer to "is the broker the dedup
store?", read from kombu's connection (for the app, before it connects) or from a connected
channel's redis-py settings (for one publish)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["ServerAddress"]

_DEFAULT_PORT = 6379


@dataclass(frozen=True)
class ServerAddress:
    """One Redis server and database: a unix socket's path, or a host and port.

    Names are compared as spelled: a broker at ``localhost`` and a store at ``127.0.0.1``
    count as two servers, and the record and the message are then written in two steps.
    """

    path: str | None
    host: str | None
    port: int
    db: int

    @classmethod
    def of_client(cls, settings: Mapping[str, Any]) -> ServerAddress:
        """From redis-py's connection settings (a connection pool's ``connection_kwargs``)."""
        path = settings.get("path")
        db = int(settings.get("db") or 0)
        if path:
            return cls(str(path), None, 0, db)
        return cls(None, settings.get("host"), int(settings.get("port") or _DEFAULT_PORT), db)

    @classmethod
    def of_broker(
        cls, hostname: str | None, port: int | None, virtual_host: object
    ) -> ServerAddress | None:
        """From kombu's Redis connection, not connected (None: a form that names no one
        server and database here, such as Sentinel's)."""
        host = hostname or "127.0.0.1"
        if "://" in host:
            # kombu's Redis transport reads a socket's path from its host (redis+socket://).
            url = urlsplit(host)
            if url.scheme != "socket" or not url.path:
                return None
            virtual_host = parse_qs(url.query).get("virtual_host", [virtual_host])[0]
            db = _db(virtual_host)
            return None if db is None else cls(url.path, None, 0, db)
        db = _db(virtual_host)
        return None if db is None else cls(None, host, int(port or _DEFAULT_PORT), db)


def _db(virtual_host: object) -> int | None:
    try:
        return int(str(virtual_host or "0").strip("/") or 0)
    except ValueError:
        return None
