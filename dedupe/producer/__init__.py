"""Enqueue-time dedup: decide before publishing whether a call is new or a duplicate, for one
call, a batch and asyncio code.

Imports: ``runs``, ``recovery``, ``store``, ``values`` and the leaves; never ``worker``.
"""
