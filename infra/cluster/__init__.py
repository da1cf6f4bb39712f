"""``Cluster`` (``api.py``): the library API behind every ``deploy.py``
command. It returns data and reports through callbacks; it never prints.
Its parts: what they all stand on (``base.py``), the nodes' life (up, stop,
start, down: ``lifecycle.py``; idle nodes stopping themselves:
``autostop.py``), jobs (``jobs.py``), runs brought home (``runs.py``), the
bucket (the nodes' side: ``bucket.py``; runs read back here:
``bucket_runs.py``), the nodes made ready for any job (``ready.py``),
logs/exec/shell/TensorBoard (``access.py``), and what ``status`` shows, as
data (``overview.py``).

Imports jobs and everything below.
"""
