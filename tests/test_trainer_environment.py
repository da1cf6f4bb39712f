"""What the trainer sets in its own environment before TensorFlow loads.

TensorFlow reads TF_CPU_ALLOCATOR_USE_BFC once, when it loads: the value
that counts is the one in the environment at the moment `import tensorflow`
starts. A real `python -m trainer` process records it there (an audit hook,
installed through sitecustomize) and ends at once: no TensorFlow is loaded,
no step is run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SITECUSTOMIZE = '''
import os, sys

def _at_tensorflow(event, args):
    if event == "import" and args[0] == "tensorflow":
        with open(os.environ["RECORD_TO"], "w") as out:
            out.write(os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "<unset>"))
        os._exit(0)

sys.addaudithook(_at_tensorflow)
'''


def _allocator_when_tensorflow_loads(tmp_path: Path, mnist: Path, **env: str) -> str:
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    record = tmp_path / "record"
    base = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "--mode", "single", "--steps", "1",
         "--output-dir", str(tmp_path / "out"), "--data-dir", str(mnist)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**base, "PYTHONPATH": f"{tmp_path}:{REPO}", "RECORD_TO": str(record), **env},
    )  # fmt: skip
    assert done.returncode == 0 and record.exists(), done.stderr[-2000:]
    return record.read_text()


def test_bfc_allocator_is_on_by_default(tmp_path: Path, mnist_dir: Path) -> None:
    assert _allocator_when_tensorflow_loads(tmp_path, mnist_dir) == "true"


@pytest.mark.parametrize("value", ["false", "0"])
def test_a_value_the_user_set_wins(tmp_path: Path, mnist_dir: Path, value: str) -> None:
    got = _allocator_when_tensorflow_loads(tmp_path, mnist_dir, TF_CPU_ALLOCATOR_USE_BFC=value)
    assert got == value
