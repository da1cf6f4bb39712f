"""Many experiments at once: the grid (``spec.py``), where a ``{name}``
placeholder meets shell code (``shell.py``), a trial as recorded
(``trial.py``), the engine that starts, follows and fetches the trials on a
transport (``engine.py``), and a sweep on a cluster's ready nodes
(``run.py``).

Imports ``infra.cluster`` and below.
"""
