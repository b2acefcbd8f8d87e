"""A publish refused at the push ends what ``before_task_publish`` began.

Celery sends ``before_task_publish`` just before kombu's publish, and that is where a duplicate
may be refused: the one-step path of a Redis broker decides in the push, the pipelined path
reads its decision there. Receivers that pair the signal with ``after_task_publish``
(OpenTelemetry's instrumentation starts a span in one and ends it in the other) would keep
what they began for good. So a refused publish gets its ``after_task_publish``, sent with the
arguments Celery gave the first signal. No message went out: Celery's task-sent event, sent
after the publish, is not sent for it.
"""

from __future__ import annotations

import threading

from celery import signals

from dedupe.values.header import is_publishing

__all__ = ["end_refused", "forget_begun", "on_publish_begun"]


class _Begun(threading.local):
    #: Celery's arguments of this thread's last ``before_task_publish`` of a guarded publish,
    #: while ``after_task_publish`` has receivers: (sender, body, exchange, routing_key, headers).
    last: tuple[object, object, object, object, object] | None = None


_begun = _Begun()


def on_publish_begun(
    sender: object = None,
    body: object = None,
    exchange: object = None,
    routing_key: object = None,
    headers: object = None,
    **_: object,
) -> None:
    """``before_task_publish``: keep what a refusal would need to end it."""
    if signals.after_task_publish.receivers and is_publishing():
        _begun.last = (sender, body, exchange, routing_key, headers)


def end_refused(task_id: str) -> None:
    """The publish of ``task_id`` was refused at the push: send the ``after_task_publish``
    that pairs its ``before_task_publish``, if that was sent."""
    begun, _begun.last = _begun.last, None
    if begun is None:
        return
    sender, body, exchange, routing_key, headers = begun
    if not isinstance(headers, dict) or headers.get("id") != task_id:
        return  # (another publish's: this one's signal was never sent)
    signals.after_task_publish.send(
        sender=sender, body=body, exchange=exchange, routing_key=routing_key, headers=headers
    )


def forget_begun() -> None:
    """A guarded publish is over: hold none of its arguments (its call's, perhaps large)."""
    _begun.last = None
