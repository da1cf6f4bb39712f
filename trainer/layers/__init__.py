"""The built-in models' layers in plain Python (``architectures.py``: each
layer's name, kind and parameter count) and how ``--mode layers`` cuts them
into stages, and the flags that set the cut (``stages.py``).

No TensorFlow: the catalog, the flags and the launcher read them before any
process trains. Imports ``trainer.errors``/``trainer.options`` only.
"""
