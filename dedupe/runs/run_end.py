"""How a run ended: one value, whichever way the worker learns of it. A DedupeTask's body
returns or raises (:meth:`RunEnd.of_body`), ``task_postrun`` reports Celery's state
(:meth:`RunEnd.of_state`), and ``task_failure`` in the prefork parent reports an exception
(:meth:`RunEnd.of_exception`)."""

from __future__ import annotations

import enum

from celery import states
from celery.exceptions import TimeLimitExceeded, WorkerLostError

__all__ = ["RunEnd"]


class RunEnd(enum.Enum):
    """How a run ended."""

    #: The body returned (Celery's SUCCESS).
    SUCCEEDED = "succeeded"
    #: The body raised an error that ends the run (Celery's FAILURE).
    FAILED = "failed"
    #: ``Retry``: the message is sent again.
    RETRIED = "retried"
    #: ``Ignore``: nothing is stored.
    IGNORED = "ignored"
    #: ``Reject()``: the message is not delivered again.
    REJECTED = "rejected"
    #: ``Reject(requeue=True)``: the message goes back to the broker, if it is not acked yet.
    REJECTED_TO_REQUEUE = "rejected_to_requeue"
    #: The hard time limit killed the run.
    TIMED_OUT = "timed_out"
    #: The process that ran it died.
    LOST = "lost"

    @property
    def failed(self) -> bool:
        """Did the run end in an error (Celery stores it as a FAILURE)?"""
        return self in (RunEnd.FAILED, RunEnd.TIMED_OUT, RunEnd.LOST)

    @classmethod
    def of_body(cls, *, returned: bool) -> RunEnd:
        """The end of a body that returned, or raised an error that ends its run (a Retry
        or a Reject goes on to Celery: it ends no run there)."""
        return cls.SUCCEEDED if returned else cls.FAILED

    @classmethod
    def of_state(cls, state: str | None, retval: object) -> RunEnd:
        """The end ``task_postrun`` reports: Celery's ``state``, and its ``retval`` (for
        REJECTED, the Reject raised). Any other state is Celery's FAILURE."""
        if state == states.REJECTED:
            return cls.REJECTED_TO_REQUEUE if getattr(retval, "requeue", False) else cls.REJECTED
        return _BY_STATE.get(state or "", cls.FAILED)

    @classmethod
    def of_exception(cls, exception: object) -> RunEnd:
        """The end ``task_failure`` reports with ``exception``."""
        if isinstance(exception, TimeLimitExceeded):
            return cls.TIMED_OUT
        if isinstance(exception, WorkerLostError):
            return cls.LOST
        return cls.FAILED


_BY_STATE = {
    states.SUCCESS: RunEnd.SUCCEEDED,
    states.RETRY: RunEnd.RETRIED,
    states.IGNORED: RunEnd.IGNORED,
}
