"""The cluster's bucket as this machine uses it: the client (``client.py``),
the check ``up`` makes before it creates anything (``check.py``), the runs
``fetch``/``runs``/``report``/``--resume`` read from it (``runs.py``), and the
commands that start the uploader on a node (``commands.py``).

Only this package and ``infra/storage/`` import google.cloud.storage.
"""
