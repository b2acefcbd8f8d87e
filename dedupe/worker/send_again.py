"""A run that must go again later (a limited run waiting its turn, a debounced message before
its deadline, a deferral) sends its message again under the same task id, as Celery's
``retry()`` does, and ends its delivery as RETRY.

If that publish fails (the broker cut, or out of reach), Celery's ``retry()`` fails the
delivery, and the call is lost with its message. An ``acks_late`` message is not acked yet:
it is given back to the broker instead (``Reject(requeue=True)``), after a pause, and is
delivered again, to try again. (A message acked at its delivery has nowhere to go back to:
the failure is raised, as Celery raises it.)
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, NoReturn, cast

from celery.canvas import Signature
from celery.exceptions import Reject, Retry

from dedupe.surfaces import RequestSurface, TaskSurface

if TYPE_CHECKING:
    from numbers import Real

__all__ = ["on_retry", "send_again"]

logger = logging.getLogger("dedupe.worker")

#: Seconds a run waits before giving back a message it could not send again: a broker that is
#: down for a while is not asked again at once, by every run that meets it.
PAUSE_BEFORE_GIVING_BACK = 1.0


def send_again(
    task: TaskSurface, request: RequestSurface, signature: Signature[object], countdown: float
) -> NoReturn:
    """Publish ``signature`` (this run's message, for ``countdown`` seconds from now) and end
    the delivery as RETRY; if the publish fails, give an ``acks_late`` message back."""
    try:
        signature.apply_async()
    except Exception as exc:
        if not _acks_late(task, request):
            raise
        logger.warning(
            "%s[%s] could not be sent again (%r): its message goes back to the broker",
            task.name,
            request.id,
            exc,
        )
        time.sleep(min(PAUSE_BEFORE_GIVING_BACK, max(countdown, 0.1)))
        raise Reject(exc, requeue=True) from exc
    # (celery-types wants numbers.Real for `when`, which a float is but mypy cannot see.)
    again = Retry(when=cast("Real", countdown), sig=signature)
    setattr(again, _SENT_AGAIN, True)
    raise again


#: On the Retry that ends a delivery :func:`send_again` sent again.
_SENT_AGAIN = "_dedupe_sent_again"


def on_retry(sender: object = None, reason: object = None, **_: object) -> None:
    """``task_retry``: cut the traceback of a Retry this layer raised. Celery's tracer keeps
    the Retry and its ExceptionInfo in its frame's locals, which the traceback holds: a cycle
    of about 300 KB that only a full collection frees, rare in a pool process, whose memory
    climbs to a plateau far above its start (Celery issue 8882). Nobody reads a traceback
    into this layer's own send; a task's own retries are left as Celery has them."""
    if isinstance(reason, BaseException) and getattr(reason, _SENT_AGAIN, False):
        reason.__traceback__ = None


def _acks_late(task: TaskSurface, request: RequestSurface) -> bool:
    late = getattr(request, "acks_late", None)
    return bool(late if late is not None else getattr(task, "acks_late", False))
