"""Many experiments at once: the grid (``spec.py``), where a ``{name}``
placeholder meets shell code (``shell.py``), a trial as recorded
(``trial.py``), and running a sweep's trials on a cluster (``run.py``).

Imports ``infra.cluster`` and below.
"""
