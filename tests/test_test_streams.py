"""scripts/test_streams.py, which `make test` runs: how the two sessions'
exit codes become one, and that a caller's marker expression keeps one
plain session (a real pytest run of a tiny suite, docker or not)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("test_streams", REPO / "scripts" / "test_streams.py")
assert _spec is not None and _spec.loader is not None
streams = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(streams)


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        ([0, 0], 0),
        ([0, 5], 0),  # a -k that selects no docker test
        ([5, 0], 0),
        ([5, 5], 5),  # nothing selected at all: pytest's own code
        ([1, 0], 1),
        ([0, 1], 1),
        ([5, 2], 2),  # interrupted
        ([1, 2], 1),
    ],
)
def test_the_sessions_codes_as_one(codes: list[int], expected: int) -> None:
    assert streams.combined(codes) == expected


def test_the_makefiles_markers_are_split_from_the_rest() -> None:
    assert streams.split(["-m", "", "-x", "-k", "a"]) == ("", ["-x", "-k", "a"])
    assert streams.split(["-m", "not docker", "tests/x.py"]) == ("not docker", ["tests/x.py"])
    assert streams.split(["-x"]) == (None, ["-x"])


def test_a_marker_expression_is_one_plain_session(tmp_path: Path) -> None:
    """`make test TEST_MARKERS=...`: the caller's expression, one session,
    its exit code (a failing test: 1), no docker log."""
    (tmp_path / "test_tiny.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.slow\ndef test_fails():\n    assert False\n\n"
        "def test_passes():\n    pass\n"
    )
    argv = [sys.executable, str(REPO / "scripts" / "test_streams.py"), "-m", "slow",
            "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-c", "/dev/null",
            str(tmp_path)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 deselected" in done.stdout, done.stdout
    assert "docker tests" not in done.stdout
