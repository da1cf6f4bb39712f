"""How the processes of a run work together: the one strategy factory,
TF_CONFIG to this task's role to a ``tf.distribute`` strategy
(``strategy.py``), the cross-worker collectives of the sync and average
modes (``collectives.py``), and the GPUs and mixed precision
(``accelerators.py``).

Imports the catalog and below.
"""
