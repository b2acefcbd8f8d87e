"""What differs from one kind of broker to another (the one-step publish, when a dead worker's
message comes back, the unacked messages restored after a data loss), behind one interface
(:class:`~dedupe.brokers.broker.Broker`) with one implementation per kind.

Imports: ``recovery``, ``store``, ``values``, ``compat`` and the leaves.
"""
