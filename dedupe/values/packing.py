"""A msgpack ``pack`` that threads can share, on any msgpack implementation."""

from __future__ import annotations

import threading
from collections.abc import Callable

import msgpack

__all__ = ["shared_pack"]


def shared_pack(**options: object) -> Callable[[object], bytes]:
    """``msgpack.Packer(autoreset=True, **options).pack``, safe to call from any thread.

    The C Packer packs a value under the GIL, so one instance serves every thread (``packb``
    would build a Packer per call). The pure-Python one (``MSGPACK_PUREPYTHON=1``, PyPy, no
    C extension) writes into a buffer it keeps between calls: shared, it mixes two threads'
    bytes, and one call takes another's key. There, each thread gets its own.

    >>> shared_pack(use_bin_type=True)([1, "a"])
    b'\\x92\\x01\\xa1a'
    """
    if not msgpack.Packer.__module__.endswith("fallback"):
        return msgpack.Packer(autoreset=True, **options).pack  # type: ignore[no-any-return]
    local = threading.local()

    def pack(value: object) -> bytes:
        try:
            packer = local.packer
        except AttributeError:
            packer = local.packer = msgpack.Packer(autoreset=True, **options)
        return packer.pack(value)  # type: ignore[no-any-return]

    return pack
