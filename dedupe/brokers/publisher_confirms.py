"""A publish under RabbitMQ's publisher confirms (kombu's ``confirm_publish``): py-amqp writes
the message, then waits on its channel for the broker's Basic.Ack or Basic.Nack. Once it
waits, the message's fate is the broker's: a connection lost before the answer leaves a
message that may be queued, and only a Nack says it is not."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager

from amqp import spec
from amqp.exceptions import MessageNacked

from dedupe.surfaces import ChannelSurface

from .shadowing import shadowing

__all__ = ["is_confirming", "telling_the_confirm"]


def is_confirming(channel: ChannelSurface) -> bool:
    """Does ``channel`` publish under confirms? (py-amqp's, of a connection made with
    ``confirm_publish``: its ``basic_publish`` is then the confirming one, whatever stands
    in for it.)"""
    return bool(getattr(getattr(channel, "connection", None), "confirm_publish", False))


def telling_the_confirm(
    channel: ChannelSurface,
    written: Callable[[], None],
    refused: Callable[[], None],
    unanswered: Callable[[], None],
) -> ContextManager[None]:
    """For a confirming publish on ``channel`` in the block: ``written()`` as the broker's
    answer is awaited (the message is written), then ``refused()`` if it is a Nack, or
    ``unanswered()`` if anything else ends the wait (the message may be queued or not). What
    ended the wait is raised after either."""
    channel_wait: Callable[..., object] = getattr(channel, "wait")  # noqa: B009 (untyped)

    def wait(method: object, *args: object, **kwargs: object) -> object:
        if not (isinstance(method, list) and spec.Basic.Ack in method):
            return channel_wait(method, *args, **kwargs)  # (confirm_select's, first)
        written()
        try:
            return channel_wait(method, *args, **kwargs)
        except MessageNacked:
            refused()
            raise
        except BaseException:
            unanswered()
            raise

    return shadowing(channel, wait=wait)
