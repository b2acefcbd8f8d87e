"""A run's lease and what the package keeps for one app: the heartbeat that renews leases, a
run's state, whether a run is dead, the app's runtime (settings, stores), the live keys.

Imports: ``recovery``, ``store``, ``values`` and the leaves.
"""
