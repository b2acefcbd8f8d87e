"""The private members of Celery, kombu and redis-py that dedupe relies on, one module per
library (:mod:`.celery_private`, :mod:`.kombu_private`, :mod:`.redis_private`). Each names
every member it uses and the shortcut that needs it, and nothing else in dedupe touches them.

Each member is looked up when its module is imported. One that is gone or changed turns its
shortcut off, and the call takes the plain path (Celery's, kombu's or redis-py's own public
code: correct, slower); :func:`warn_missing`, called by ``install()``, names it in a warning.
Never a wrong answer, never an error at import. The versions tested are in docs/index.md.
"""

from __future__ import annotations

import logging
import threading

from . import celery_private, kombu_private, redis_private
from .members import Member, Members

__all__ = ["Member", "Members", "known_members", "missing_members", "warn_missing"]

logger = logging.getLogger("dedupe.compat")

_LIBRARIES = (celery_private.MEMBERS, kombu_private.MEMBERS, redis_private.MEMBERS)


def known_members() -> list[Member]:
    """Every private member of Celery, kombu and redis-py that dedupe uses."""
    return [member for members in _LIBRARIES for member in members.known]


def missing_members(*, later_too: bool = False) -> list[Member]:
    """Every member missing or changed in the running Celery, kombu and redis-py, of those
    looked up so far; ``later_too``: those looked up at their first use too, now."""
    if later_too:
        for members in _LIBRARIES:
            for check in members.later:
                check()
    return [member for members in _LIBRARIES for member in members.missing]


_warned = False
_warn_lock = threading.Lock()


def warn_missing() -> None:
    """Name each missing member in a warning, once per process (``install()`` calls it)."""
    global _warned
    with _warn_lock:
        if _warned:
            return
        _warned = True
    for member in missing_members():
        logger.warning(member.warning())
