"""The data a run trains on: MNIST from the official IDX files (``mnist.py``),
which examples each worker reads, batch by batch (``inputs.py``), image
patches as index windows (``patches.py``, the dae's), and
``python -m trainer.data.prefetch`` (``prefetch.py``), which fetches what a
run needs before the task's network goes away.

Imports the catalog, the flags and the errors.
"""
