"""A job's life on the nodes: start its tasks and watch them (``job.py``),
wait for their ports (``readiness.py``), follow the chief's progress lines
(``protocol.py``, ``progress.py``), say why a task failed (``failure.py``,
``tf_noise.py``), go on after a preemption (``recovery.py``), and the whole
life as one call (``run.py``: launch, follow, remember, fetch). What it asks
of its cluster is ``needs.py``'s ``JobCluster``; where results land,
``destination.py``; TensorBoard, ``tensorboard.py``; which Keras a user's
program gets, ``keras_choice.py``.

Imports setup and below; never ``infra.cluster``.
"""
