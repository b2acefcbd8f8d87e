"""``DedupeTask``'s request class (Celery's ``Task.Request``): the run's claim sent as the
worker accepts its message, where the same thread runs it (early_claim.py)."""

from __future__ import annotations

import os
from typing import Any

from celery.worker.request import Request

from . import early_claim
from .early_claim import drop_unread, send_claim

__all__ = ["ClaimingRequest"]


class ClaimingRequest(Request):
    """Sends the run's claim as Celery accepts the message, where the accepting thread runs
    it (Celery's solo and threads pools): the claim's round trip overlaps Celery's work up
    to the run. A run that never starts undoes it (:func:`~.early_claim.drop_unread`)."""

    def on_accepted(self, pid: Any, time_accepted: float) -> None:
        sent = pid == os.getpid()  # (a prefork child's or a greenlet's: not this thread)
        if sent:
            send_claim(self)
        try:
            super().on_accepted(pid, time_accepted)
        except BaseException:
            unread = early_claim.take(self.id) if sent else None
            if unread is not None:
                drop_unread(self.task, unread, consumed=self.acknowledged)
            raise
