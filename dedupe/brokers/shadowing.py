"""Methods of one object instance stood in for, for a block: how a publish seam reaches into
kombu's channel and producer without touching their classes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["shadowing"]


@contextmanager
def shadowing(channel: object, **methods: Callable[..., object]) -> Iterator[None]:
    """Shadow methods on this one channel instance for the block; what the instance had before
    is back after it (kombu's channels are shared by no other thread while a producer holds
    them). py-amqp puts ``basic_publish_confirm`` on the instance under confirm_publish: a
    shadow that merely dropped its own attribute would turn publisher confirms off."""
    missing = object()
    saved = {name: channel.__dict__.get(name, missing) for name in methods}
    channel.__dict__.update(methods)
    try:
        yield
    finally:
        for name, before in saved.items():
            if before is missing:
                channel.__dict__.pop(name, None)
            else:
                channel.__dict__[name] = before
