"""What a compat module knows of one library's private members."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Member", "Members"]


@dataclass(frozen=True, slots=True)
class Member:
    """A private member dedupe uses: where it lives, and what is turned off without it."""

    library: str
    path: str
    shortcut: str


class Members:
    """One library's members, each looked up once: all of them, and the missing ones."""

    def __init__(self, library: str) -> None:
        self.library = library
        self.known: list[Member] = []
        self.missing: list[Member] = []

    def need(self, path: str, shortcut: str, present: Callable[[], object]) -> bool:
        """Is ``path`` there as dedupe uses it (``present()`` true, and raising nothing)?"""
        member = Member(self.library, path, shortcut)
        self.known.append(member)
        try:
            found = bool(present())
        except Exception:
            found = False
        if not found:
            self.missing.append(member)
        return found
