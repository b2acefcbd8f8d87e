"""The :class:`~dedupe.store.store.Store`'s commands, one module per concept: each a mixin of
the store's methods for it (as redis-py composes its client of command mixins), or the values
its scripts take.
"""
