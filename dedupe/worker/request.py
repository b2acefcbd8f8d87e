"""``DedupeTask``'s request class (Celery's ``Task.Request``): the run's claim sent as the
worker accepts its message, where the same thread runs it (early_claim.py)."""

from __future__ import annotations

import os
from typing import Any

from celery.worker.request import Request

from . import early_claim
from .execution import send_claim

__all__ = ["ClaimingRequest"]


class ClaimingRequest(Request):
    """Sends the run's claim as Celery accepts the message, where the accepting process
    runs it (solo, threads): the claim's round trip overlaps Celery's work up to the run.
    (Prefork and green pools accept for a child or a greenlet, named by its own pid:
    those runs claim as they start.)"""

    def on_accepted(self, pid: Any, time_accepted: float) -> None:
        sent = pid == os.getpid()
        if sent:
            send_claim(self)
        try:
            super().on_accepted(pid, time_accepted)
        except BaseException:
            if sent:
                early_claim.take(self.id)  # (its run never comes: the claim is left to its lease)
            raise
