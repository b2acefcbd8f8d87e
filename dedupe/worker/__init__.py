"""Worker side: claim a run's key when it starts, guard it, release it when it ends, in the
process that runs the task and in the prefork pool's main process.

In the process that runs the task: ``lifecycle`` (the worker's start, a pool process's
exit), ``early_claim`` (the claim sent as a message is accepted), ``run_start``
(``task_prerun``: the claim), ``run_guard`` (``before_start``: skip or defer),
``publish_hook`` (a continuation published in a run), ``release`` (the run's end). Below
them: ``run_spec``, ``claim``, ``requeue``, ``limits``, ``deferral``, ``send_again``. In the
prefork pool's parent: ``main_process``.

Imports: ``runs``, ``recovery``, ``store``, ``values`` and the leaves; never ``producer``.
"""
