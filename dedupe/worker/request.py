"""``DedupeTask``'s request class (Celery's ``Task.Request``): the run's claim sent as the
worker accepts its message, where the same thread runs it (early_claim.py); a limited run's
slot freed as the pool's parent learns that its child died (before Celery may put the
message back); the key of a run Celery cancels settled once its process is gone."""

from __future__ import annotations

import os
from typing import Any

from billiard.einfo import ExceptionInfo
from billiard.exceptions import WorkerLostError
from celery.app.task import Context
from celery.worker.request import Request

from dedupe.values.limits import LimitHeader

from . import early_claim
from .early_claim import drop_unread, send_claim
from .limited_runs import free_dead_slots
from .main_process import on_cancelled

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

    def cancel(self, pool: Any, *args: Any, **kwargs: Any) -> None:
        # Celery cancels a running run it can no longer acknowledge (a broker connection
        # lost) or wait for (a cold shutdown): it terminates the run's process, whose key
        # the main process settles once the process is gone. (Read first: Celery marks the
        # request ready.)
        running, acknowledged = bool(self.time_start), self.acknowledged
        try:
            super().cancel(pool, *args, **kwargs)  # (its announce may fail once signalled)
        finally:
            if running:
                # The message's own fields, headers included (where the key's header is).
                fields = self.request_dict
                context = Context(fields, headers=fields)
                on_cancelled(self.task, context, acknowledged=acknowledged)

    def on_failure(
        self, exc_info: ExceptionInfo, send_failed_event: bool = True, return_ok: bool = False
    ) -> None:
        # A child lost in a limited run: its slot goes now. Celery may put the message back
        # next (reject_on_worker_lost), sending no task_failure, and the redelivery would
        # meet the dead run's slot and be dropped as a copy of a live run.
        if _lost_child(exc_info):
            limit = LimitHeader.read(self.request_dict)
            if limit is not None:
                free_dead_slots(self.task, self.id, limit)
        super().on_failure(exc_info, send_failed_event, return_ok)


def _lost_child(exc_info: ExceptionInfo) -> bool:
    # (Its exception is wrapped for pickling; its type is the exception's own.)
    kind: object = getattr(exc_info, "type", None)
    return isinstance(kind, type) and issubclass(kind, WorkerLostError)
