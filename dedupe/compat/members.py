"""What a compat module knows of one library's private members."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Member", "Members"]

logger = logging.getLogger("dedupe.compat")


@dataclass(frozen=True, slots=True)
class Member:
    """A private member dedupe uses: where it lives, and what is turned off without it."""

    library: str
    path: str
    shortcut: str

    def warning(self) -> str:
        """What a log says when the member is missing."""
        return (
            f"celery-dedupe: {self.library}'s {self.path} is not there as this version of dedupe "
            f"knows it; {self.shortcut} is off, calls take the plain path (correct, slower). "
            f"Please report your {self.library} version."
        )


class Members:
    """One library's members, each looked up once: all of them, and the missing ones."""

    def __init__(self, library: str) -> None:
        self.library = library
        self.known: list[Member] = []
        self.missing: list[Member] = []
        #: The checks of members looked up at their first use (:meth:`need_later`).
        self.later: list[Callable[[], bool]] = []

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

    def need_later(
        self, path: str, shortcut: str, present: Callable[[], object]
    ) -> Callable[[], bool]:
        """:meth:`need`, looked up at the first call of the function returned, not now: for
        a member whose module must not be imported with dedupe. (Celery's worker consumer
        binds ``build_tracer`` at its import; a tracing tool initialised after
        ``import dedupe`` patches it, and the worker must see the patched one.)"""
        member = Member(self.library, path, shortcut)
        self.known.append(member)
        found: list[bool] = []

        def check() -> bool:
            if not found:
                try:
                    there = bool(present())
                except Exception:
                    there = False
                if not there:
                    self.missing.append(member)
                    logger.warning(member.warning())
                found.append(there)
            return found[0]

        self.later.append(check)
        return check
