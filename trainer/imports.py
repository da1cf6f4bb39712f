"""TensorFlow's import on the chief's path from the command to the first step.

``import tensorflow`` imports Keras eagerly (its optimizers, for their
SavedModel registrations), and Keras imports ``matplotlib.pyplot`` for
``keras.visualization``, which the trainer never calls: matplotlib is 0.5 to
0.8 s of CPU of a 4 s import on a 2-core machine, paid before the first step
while the job's other tasks start on the same cores. Keras takes a missing
matplotlib as "no plotting" (``plt = None``), so the chief imports
TensorFlow with matplotlib kept out, and imports matplotlib itself in the
background once training runs (``outputs.preload_plotting``), for the plots
at the end. Only this process's Keras loses its plotting functions; a
user's program (``deploy.py run``) imports as it likes.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from types import ModuleType

# The top-level packages kept out of TensorFlow's import.
KEPT_OUT = ("matplotlib",)


@contextlib.contextmanager
def kept_out(names: tuple[str, ...] = KEPT_OUT) -> Iterator[None]:
    """While in the block, ``import NAME`` (and its submodules) raises
    ImportError for each of ``names`` not imported yet; afterwards they
    import as usual. A None in sys.modules is Python's own way to say so."""
    blocked = [name for name in names if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def import_tensorflow() -> ModuleType:
    """``import tensorflow``, without matplotlib (see the module's doc)."""
    with kept_out():
        import tensorflow

    return tensorflow
