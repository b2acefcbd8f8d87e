"""Whether a publish reached its transport: what a sender whose publish raised must know
before it frees what it holds for the message. A message that reached the transport may be
out (a confirm that never came back, a connection that died after the write): it keeps what
it holds. A message that never reached it is surely not out; nor is one of dedupe's one-step
pushes on a Redis broker that failed before its script was written."""

from __future__ import annotations

from collections.abc import Callable

from dedupe.store.script_runner import Unanswered
from dedupe.surfaces import ProducerSurface

from .publisher_confirms import is_confirming, telling_the_confirm
from .shadowing import shadowing

__all__ = ["PublishWatch"]


class PublishWatch:
    """Entered around the publishes made on ``producer``: :attr:`reached` once the message may
    be out: under publisher confirms, once the broker's answer is awaited (the message is
    written) and unless it is a Nack; else once its channel's ``basic_publish`` is called.
    (A seam that pushes the message itself, dedupe's one-step push on a Redis broker, passes
    it by: :meth:`may_be_out` reads its fate from the error.)

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

    def may_be_out(self, error: BaseException) -> bool:
        """May the message of the publish that raised ``error`` be out? It reached the
        transport, or a one-step push's script was written and its reply never came (it may
        have pushed the message)."""
        return self.reached or _unanswered(error)

    def __enter__(self) -> PublishWatch:
        self._shadow.__enter__()
        return self

    def __exit__(self, *_: object) -> None:
        self._shadow.__exit__()


def _unanswered(error: BaseException | None) -> bool:
    """Is :class:`~dedupe.store.script_runner.Unanswered` in ``error``'s chain?"""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, Unanswered):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False
