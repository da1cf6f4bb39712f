"""The commands of ``deploy.py``, a module per group: the nodes' life and
access (``nodes.py``: up, status, stop, start, autostop, down, ssh,
forget-host), what runs on them (``jobs.py``: train, run, exec, sweep,
cancel, logs) and a run's results (``runs.py``: tensorboard, fetch, runs,
report). Each command parses, calls ``Cluster`` and renders; deploy.py
makes the group (its ``--config``, the ``Cluster`` every command is given)
and adds each module's ``COMMANDS`` to it.
"""
