"""Whether a publish reached its transport: what a sender whose publish raised must know
before it frees what it holds for the message. A message that reached the transport may be
out (a confirm that never came back, a connection that died after the write): it keeps what
it holds. A message that never reached it is surely not out."""

from __future__ import annotations

from collections.abc import Callable

from dedupe.surfaces import ProducerSurface

from .publisher_confirms import is_confirming, telling_the_confirm
from .shadowing import shadowing

__all__ = ["PublishWatch"]


class PublishWatch:
    """Entered around the publishes made on ``producer``: :attr:`reached` once the message may
    be out: under publisher confirms, once the broker's answer is awaited (the message is
    written) and unless it is a Nack; else once its channel's ``basic_publish`` is called.
    (A seam that pushes the message itself, dedupe's one-step push on a Redis broker, passes
    it by: its own plan knows.)

    ``producer.channel`` is asked for at once: a broker out of reach raises here, before
    any message exists.
    """

    __slots__ = ("_shadow", "reached")

    def __init__(self, producer: ProducerSurface) -> None:
        self.reached = False
        channel = producer.channel
        # (The channel's own at this moment: py-amqp's confirming publish under
        # confirm_publish, which waits for the broker's confirm.)
        transport_publish: Callable[..., object] = channel.basic_publish
        confirming = is_confirming(channel)

        def written() -> None:
            self.reached = True

        def refused() -> None:
            self.reached = False

        def basic_publish(*args: object, **kwargs: object) -> object:
            if not confirming:
                self.reached = True
                return transport_publish(*args, **kwargs)
            with telling_the_confirm(channel, written, refused, written):
                return transport_publish(*args, **kwargs)

        self._shadow = shadowing(channel, basic_publish=basic_publish)

    def __enter__(self) -> PublishWatch:
        self._shadow.__enter__()
        return self

    def __exit__(self, *_: object) -> None:
        self._shadow.__exit__()
