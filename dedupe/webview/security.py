"""Who may see the web view, and who may clear a key from it.

Answering: only a request whose ``Host`` header names the server as it is served (loopback
names, the address it listens on, and the names given by ``--allowed-host``); any other gets
400, so a page at a name an attacker rebinds to 127.0.0.1 (DNS rebinding) reads nothing.
Seeing: anyone who reaches the port, unless the app sets ``dedupe_web_token`` (a bearer
token) or ``dedupe_web_basic_auth`` (``"user:password"``); the server binds 127.0.0.1 unless
``--host`` says otherwise. Clearing: only a server started with ``--allow-clear``, and only a
request that carries that server's clear token (made at start, printed once, never stored)
and its CSRF token (in the page it served) as headers, from the page's own origin. A form or
a script on another site can set neither header.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["CLEAR_HEADER", "CSRF_HEADER", "LOOPBACK_NAMES", "Guard", "host_name", "served_names"]

#: The header that carries the clear token.
CLEAR_HEADER = "x-dedupe-clear-token"
#: The header that carries the CSRF token of the page.
CSRF_HEADER = "x-csrf-token"


#: The names a server is always answered under: only this machine resolves them to itself.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port, lower case (IPv6 without brackets).

    >>> [host_name(h) for h in ("Example.test:9808", "[::1]:9808", "127.0.0.1", "::1")]
    ['example.test', '::1', '127.0.0.1', '::1']
    """
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    if header.count(":") > 1:  # (a bare IPv6 address: no port can be told apart)
        return header
    return header.partition(":")[0].rstrip(".")


def served_names(bound: str, allowed: tuple[str, ...] = ()) -> frozenset[str]:
    """The names a server bound to ``bound`` answers under: loopback names, ``bound`` itself
    (unless it is every address), and the operator's ``allowed`` names.

    >>> sorted(served_names("127.0.0.1", ("dedupe.internal",)))
    ['127.0.0.1', '::1', 'dedupe.internal', 'localhost']
    """
    names = set(LOOPBACK_NAMES) | {host_name(name) for name in allowed if name.strip()}
    if bound not in ("0.0.0.0", "::", ""):
        names.add(host_name(bound) if bound.startswith("[") else bound.lower())
    return frozenset(names)


def _is_loopback_ip(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


@dataclass(frozen=True)
class Guard:
    """One server's credentials and tokens.

    >>> guard = Guard(token="a-long-bearer-token", allow_clear=True)
    >>> guard.admits({"authorization": "Bearer a-long-bearer-token"})
    True
    >>> guard.refuses_clear({"host": "127.0.0.1:9808"})
    'no clear token: open the URL the server printed at start'
    >>> guard.refuses_host({"host": "rebind.attacker.test:9808"})
    'unknown Host rebind.attacker.test: serve under it with --allowed-host rebind.attacker.test'
    """

    token: str | None = None
    basic: tuple[str, str] | None = None
    allow_clear: bool = False
    #: Made once per process: a restarted server asks for the new one.
    clear_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    csrf_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    #: The names (``Host`` headers, port aside) it answers under: see :func:`served_names`.
    hosts: frozenset[str] = LOOPBACK_NAMES

    def refuses_host(self, headers: Mapping[str, str]) -> str | None:
        """Why this request's ``Host`` is not a name the server is served under (None: it is)."""
        name = host_name(headers.get("host", ""))
        if name in self.hosts or _is_loopback_ip(name):
            return None
        shown = name[:100] or "(none)"
        return f"unknown Host {shown}: serve under it with --allowed-host {shown}"

    @property
    def asks_credentials(self) -> bool:
        """Does a request need a bearer token or basic auth?"""
        return self.token is not None or self.basic is not None

    def admits(self, headers: Mapping[str, str]) -> bool:
        """May this request see the view (its ``Authorization`` header)?"""
        if not self.asks_credentials:
            return True
        scheme, _, value = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self.token is not None:
            return _same(value.strip(), self.token)
        if scheme.lower() == "basic" and self.basic is not None:
            try:
                user, _, password = base64.b64decode(value.strip()).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return False
            # (Both compared whatever the first says: the time tells nothing.)
            right_user = _same(user, self.basic[0])
            right_password = _same(password, self.basic[1])
            return right_user and right_password
        return False

    def refuses_clear(self, headers: Mapping[str, str]) -> str | None:
        """Why this request may not clear a key (None: it may)."""
        if not self.allow_clear:
            return "clearing is off: start the server with --allow-clear"
        if not headers.get(CLEAR_HEADER):
            return "no clear token: open the URL the server printed at start"
        if not _same(headers.get(CLEAR_HEADER), self.clear_token):
            return "wrong clear token: the server makes a new one each time it starts"
        if not _same(headers.get(CSRF_HEADER), self.csrf_token):
            return "no CSRF token of this server's page: reload the page"
        origin = headers.get("origin")
        host = headers.get("host", "")
        if origin is not None and origin.partition("://")[2] != host:
            return f"a request from another origin ({origin})"
        return None
