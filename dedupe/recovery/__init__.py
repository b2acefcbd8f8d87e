"""After the dedup Redis lost its data: the records of messages the broker or a worker holds,
written back from what they carry.

Imports: ``store``, ``values`` and the leaves.
"""
