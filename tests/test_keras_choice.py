"""Which Keras a user's program gets as tf.keras (infra/jobs/keras_choice.py):
Keras 2 for a main file written for tf.keras the tutorials' way, Keras 3
for one that imports keras, the user's own TF_USE_LEGACY_KERAS always."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.jobs.keras_choice import LEGACY_ENV, legacy_keras, main_file

TUTORIAL = "import tensorflow as tf\nmodel = tf.keras.Sequential([])\n"


@pytest.mark.parametrize(
    ("source", "legacy"),
    [
        (TUTORIAL, True),
        ("from tensorflow import keras\nkeras.Sequential()\n", True),
        ("from tensorflow import data, keras  # both\n", True),
        ("import tensorflow.keras as K\n", True),
        ("import keras\nimport tensorflow as tf\nx = tf.keras.layers\n", False),  # Keras 3's
        ("from keras import layers\nimport tensorflow as tf\ntf.keras\n", False),
        ("import tensorflow as tf\nprint(tf.__version__)\n", False),  # no Keras at all
        ("import tensorflow as tf\n# mykeras.tf.keras_thing is not tf.keras\nx = 1\n", True),
        ("import keras_tuner\nimport tensorflow as tf\ntf.keras.Model\n", True),
    ],
)
def test_the_main_files_text_decides(tmp_path: Path, source: str, legacy: bool) -> None:
    (tmp_path / "prog.py").write_text(source)
    got = legacy_keras(["python", "prog.py", "--epochs", "3"], tmp_path, {})
    assert (got == tmp_path / "prog.py") if legacy else got is None


def test_the_users_own_setting_wins(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(TUTORIAL)
    assert legacy_keras(["python", "prog.py"], tmp_path, {LEGACY_ENV: "0"}) is None


@pytest.mark.parametrize(
    ("argv", "found"),
    [
        (["python", "prog.py"], "prog.py"),
        (["python3", "-u", "prog.py", "x.py"], "prog.py"),
        (["python3.11", "-W", "ignore", "prog.py"], "prog.py"),
        (["python", "-m", "pkg.train"], "pkg/train.py"),
        (["python", "-m", "pkg"], "pkg/__main__.py"),
        (["/usr/bin/python3", "sub/deep.py"], "sub/deep.py"),
        (["python", "-c", "import tensorflow as tf; tf.keras"], None),
        (["bash", "-c", "python prog.py"], None),
        (["python", "missing.py"], None),
        (["python"], None),
        (["./prog.py"], None),
    ],
)
def test_the_main_file_of_a_command(tmp_path: Path, argv: list[str], found: str | None) -> None:
    for name in ("prog.py", "pkg/train.py", "pkg/__main__.py", "sub/deep.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(TUTORIAL)
    got = main_file(argv, tmp_path)
    assert got == (tmp_path / found if found else None)


def test_a_file_that_cannot_be_read_is_no_decision(tmp_path: Path) -> None:
    (tmp_path / "prog.py").mkdir()  # a folder named like a script
    assert legacy_keras(["python", "prog.py"], tmp_path, {}) is None
