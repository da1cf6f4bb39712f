"""Runs compared, from their folders: training time and accuracy
(``compare.py``), a sweep's trials and an ensemble's members (``sweeps.py``),
and where ``--mode layers`` put each layer (``placement.py``).

The top layer: imports sweeps and below.
"""
