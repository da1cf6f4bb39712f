"""The training loop and what it is made of: the loops (``loops.py``: when
steps run, and when to log, checkpoint and average), the step and many steps
per ``tf.function`` call (``steps.py``), the optimizer (``optimizers.py``) and
its step size (``schedules.py``), checkpoints (``checkpoints.py``), and what
the chief leaves behind (``outputs.py``: the run folder; ``progress.py``: one
``@tfcluster {json}`` line per event, which infra/jobs/protocol.py reads).

Imports models, data and below; knows nothing of modes or strategies.
"""
