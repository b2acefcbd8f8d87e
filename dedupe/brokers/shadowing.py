"""Methods of one object instance stood in for, for a block: how a publish seam reaches into
kombu's channel and producer without touching their classes."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["shadowing"]

_MISSING = object()


class shadowing:  # (named as the function it was: ``with shadowing(channel, ...)``)
    """Shadow methods on this one channel instance for the block; what the instance had before
    is back after it (kombu's channels are shared by no other thread while a producer holds
    them). py-amqp puts ``basic_publish_confirm`` on the instance under confirm_publish: a
    shadow that merely dropped its own attribute would turn publisher confirms off.

    A class, not a generator: a publish enters two or three of these, and a generator-based
    block costs each call about a microsecond more.
    """

    __slots__ = ("_methods", "_saved", "_target")

    def __init__(self, channel: object, **methods: Callable[..., object]) -> None:
        self._target = channel
        self._methods = methods
        self._saved: dict[str, object] = {}

    def __enter__(self) -> None:
        own = self._target.__dict__
        self._saved = {name: own.get(name, _MISSING) for name in self._methods}
        own.update(self._methods)

    def __exit__(self, *_: object) -> None:
        own = self._target.__dict__
        for name, before in self._saved.items():
            if before is _MISSING:
                own.pop(name, None)
            else:
                own[name] = before
