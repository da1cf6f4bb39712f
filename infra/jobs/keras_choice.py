"""Which Keras a user's program gets as ``tf.keras``.

TensorFlow 2.16+ makes ``tf.keras`` Keras 3, whose ``model.fit`` fails
under MultiWorkerMirroredStrategy (``Attempt to convert a value
(PerReplica:{...}) to a Tensor``: keras-team/keras#20585, open) and has no
ParameterServerStrategy at all. Keras 2 (the tf-keras package, installed on
every node at TensorFlow's version: trainer/requirements-no-deps.txt) has
both, and is what ``tf.keras`` means with ``TF_USE_LEGACY_KERAS=1``: the
Keras of TensorFlow's multi-worker tutorials.

So a program whose main file uses ``tf.keras`` (``tf.keras.``,
``tensorflow.keras``, ``from tensorflow import keras``) and never imports
``keras`` itself is run with ``TF_USE_LEGACY_KERAS=1``: it was written the
way those tutorials write one. A program that imports ``keras`` was written
for Keras 3 and keeps it (``TF_USE_LEGACY_KERAS`` changes only what
``tf.keras`` is, never ``import keras``), and a variable the user sets
(``--env``, ``job.env``) always wins. Only the file named on the command
line is read (``python prog.py``, ``python -m pkg.prog``), as text: nothing
of the user's is imported or run here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

LEGACY_ENV = "TF_USE_LEGACY_KERAS"
# A main file larger than this is not read (a program is a few KB).
MAX_SOURCE_BYTES = 1 << 20

_USES_TF_KERAS = re.compile(
    r"\btf\.keras\b|\btensorflow\.keras\b|^\s*from\s+tensorflow\s+import\s[^\n#]*\bkeras\b",
    re.MULTILINE,
)
_IMPORTS_KERAS = re.compile(r"^\s*(?:import\s+keras\b|from\s+keras\b)", re.MULTILINE)
_PYTHON = re.compile(r"^python(?:3(?:\.\d+)?)?\Z")


def main_file(argv: Sequence[str], workdir: Path) -> Path | None:
    """The Python file ``argv`` runs, in ``workdir``: the script of
    ``python prog.py ...``, the module of ``python -m pkg.prog``; None for
    anything else (a shell, a binary) or a file that is not there."""
    if len(argv) < 2 or not _PYTHON.match(PurePosixPath(argv[0]).name):
        return None
    args = list(argv[1:])
    while args:
        arg = args.pop(0)
        if arg == "-m" and args:
            module = Path(*args[0].split("."))
            candidates = [workdir / module.with_suffix(".py"), workdir / module / "__main__.py"]
            return next((c for c in candidates if c.is_file()), None)
        if arg in ("-c", "-") or arg.startswith("-c"):
            return None
        if arg in ("-W", "-X"):
            args = args[1:]  # the option's value
            continue
        if arg.startswith("-"):
            continue
        script = workdir / arg
        return script if arg.endswith(".py") and script.is_file() else None
    return None


def legacy_keras(argv: Sequence[str], workdir: Path, env: Mapping[str, str]) -> Path | None:
    """The main file of ``argv`` when the program is to run with
    ``TF_USE_LEGACY_KERAS=1`` (see the module's docstring); None otherwise."""
    if LEGACY_ENV in env:
        return None
    path = main_file(argv, workdir)
    if path is None:
        return None
    try:
        with path.open("rb") as handle:
            text = handle.read(MAX_SOURCE_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None
    if _USES_TF_KERAS.search(text) and not _IMPORTS_KERAS.search(text):
        return path
    return None
