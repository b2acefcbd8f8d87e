"""Worker side: claim a run's key when it starts, guard it, release it when it ends, in the
process that runs the task and in the prefork pool's main process.

Imports: ``runs``, ``recovery``, ``store``, ``values`` and the leaves; never ``producer``.
"""
