"""What a new user met in the first hour (issue 30), on the local cluster
through the command line: TensorFlow's load-time log left out of `run`,
`exec` and `logs` unless --raw, ..."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from deploy import cli
from tests.procs import none_left_in

REPO = Path(__file__).resolve().parents[1]
NOISE = REPO / "tests" / "recorded" / "tf-load-log-here.txt"


def deploy(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(REPO / "tests" / "programs" / "stand_in.py", folder / "stand_in.py")
    shutil.copy(NOISE, folder / "noise.txt")
    yield folder
    none_left_in(folder)


def test_tensorflows_load_log_is_left_out_unless_raw(workdir: Path) -> None:
    code, out = deploy("exec", "--workdir", str(workdir), "--node", "pc-1", "--", "cat", "noise.txt")
    assert code == 0, out
    assert out.splitlines() == ["pc-1 | 2.21.0"]
    code, out = deploy(
        "exec", "--raw", "--workdir", str(workdir), "--node", "pc-1", "--", "cat", "noise.txt"
    )
    assert code == 0 and "cpu_feature_guard.cc" in out and "absl::InitializeLog" in out, out

    code, out = deploy("run", "--workdir", str(workdir), "--env", "PRINT_FILE=noise.txt",
                       "--", "python", "stand_in.py")  # fmt: skip
    assert code == 0, out
    assert "chief-0 started" in out and "2.21.0" in out
    assert "cpu_feature_guard" not in out and "absl" not in out and "To enable" not in out, out
    code, out = deploy("logs")
    assert code == 0 and "pc-2/worker-0 2.21.0" in out and "pc-1/chief-0 2.21.0" in out, out
    assert "cpu_feature_guard" not in out and "absl" not in out, out
    code, out = deploy("logs", "--raw")
    assert code == 0 and out.count("cpu_feature_guard") == 4, out  # ps, 2 workers, chief


def test_logs_follow_ends_when_the_job_ends_and_says_so(workdir: Path) -> None:
    """A --detach job whose ps and workers would serve forever: the follow
    ends with its chief, and what it left running is stopped (the fixture
    finds no process left); followed again, it says so at once."""
    code, out = deploy("run", "--detach", "--workdir", str(workdir), "--env", "CHIEF_SLEEP=4",
                       "--env", "CHIEF_CODE=3", "--", "python", "stand_in.py")  # fmt: skip
    assert code == 0, out
    run_id = out.split("job ", 1)[1].split(":", 1)[0]
    began = time.monotonic()
    code, out = deploy("logs", "--follow")
    assert code == 0, out
    assert "pc-1/chief-0 chief says goodbye" in out and "pc-3/worker-1 worker-1 started" in out
    assert out.splitlines()[-1] == f"job {run_id} has ended (exit code 3): nothing more to follow"
    assert time.monotonic() - began < 120
    code, out = deploy("logs", "--follow", "--lines", "1")
    assert code == 0, out
    assert out.splitlines()[-1] == f"job {run_id} had ended already (exit code 3): nothing more to follow"
