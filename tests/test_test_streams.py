"""scripts/test_streams.py, which `make test` runs: the two sessions (a
fake `docker` that answers on PATH, a tiny suite of docker-marked and
other tests, real pytest processes), their output and exit code, Ctrl-C,
and the cases that keep one plain session."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "test_streams.py"
_spec = importlib.util.spec_from_file_location("test_streams", SCRIPT)
assert _spec is not None and _spec.loader is not None
streams = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(streams)

# Each test leaves a file per run, and its fixture one once torn down: a
# test run twice, or a teardown skipped by an interrupt, shows.
SUITE = """
import os, time, pytest
from pathlib import Path
MARKS = Path(os.environ["MARKS"])

@pytest.fixture
def mark(request):
    name = request.node.name
    (MARKS / f"{name}.{os.getpid()}.ran").touch()
    yield
    (MARKS / f"{name}.{os.getpid()}.torn-down").touch()

@pytest.mark.docker
def test_docker_fails(mark):
    if os.environ.get("DOCKER_SLEEP"):
        time.sleep(60)
    assert False

@pytest.mark.docker
@pytest.mark.slow
def test_docker_slow(mark):
    pass

def test_other_passes(mark):
    if os.environ.get("OTHER_SLEEP"):
        time.sleep(60)
    if os.environ.get("OTHER_FAILS") and os.environ.get("DOCKER_SLEEP"):
        # Fail once the docker session is asleep in its test (under load it
        # may still be starting, and would have nothing to tear down).
        deadline = time.monotonic() + 30
        while not list(MARKS.glob("test_docker_fails.*.ran")) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not os.environ.get("OTHER_FAILS")

@pytest.mark.slow
def test_other_slow(mark):
    pass
"""


@pytest.fixture
def suite(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The tiny suite, and an environment whose `docker info` answers."""
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "test_tiny.py").write_text(SUITE)
    (tmp_path / "marks").mkdir()
    (tmp_path / "bin").mkdir()
    docker = tmp_path / "bin" / "docker"
    docker.write_text("#!/bin/sh\nexit 0\n")
    docker.chmod(0o755)
    (tmp_path / "tmp").mkdir()
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "MARKS": str(tmp_path / "marks"),
        "TMPDIR": str(tmp_path / "tmp"),  # where the docker session's log goes
    }
    env.pop("TFCLUSTER_TEST_ONE_SESSION", None)
    return tmp_path, env


def argv(folder: Path, *args: str) -> list[str]:
    return [sys.executable, str(SCRIPT), *args, "-p", "no:cacheprovider", "-c", "/dev/null",
            "--rootdir", str(folder / "suite"), "-o", "addopts=", str(folder / "suite")]  # fmt: skip


def marks(folder: Path, suffix: str) -> list[str]:
    return sorted(p.name.split(".")[0] for p in (folder / "marks").glob(f"*.{suffix}"))


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
        ([0, -9], 137),  # killed: as a shell says it
    ],
)
def test_the_sessions_codes_as_one(codes: list[int], expected: int) -> None:
    assert streams.combined(codes) == expected


def test_every_marker_expression_is_taken_out_the_last_one_counts() -> None:
    assert streams.split(["-m", "", "-x", "-k", "a"]) == ("", ["-x", "-k", "a"])
    assert streams.split(["-m", "", "-m", "slow", "t.py"]) == ("slow", ["t.py"])
    assert streams.split(["-mslow", "-x"]) == ("slow", ["-x"])
    assert streams.narrowed("docker", "slow or e2e") == "docker and (slow or e2e)"
    assert streams.narrowed("not docker", "") == "not docker"


def test_two_sessions_each_test_once_the_docker_output_after(
    suite: tuple[Path, dict[str, str]],
) -> None:
    folder, env = suite
    done = subprocess.run(argv(folder, "-m", ""), env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    out = done.stdout
    assert done.returncode == 1, out + done.stderr  # the docker test failed
    header = out.index(" the docker tests' session ")
    assert "2 passed" in out[:header] and "1 failed, 1 passed" in out[header:], out
    assert out.rstrip().endswith("the docker tests' 1: exit 1"), out
    assert marks(folder, "ran") == sorted(
        ["test_docker_fails", "test_docker_slow", "test_other_passes", "test_other_slow"]
    )
    assert not list((folder / "tmp").iterdir())  # the docker session's log is gone


def test_a_marker_in_the_arguments_narrows_both_sessions(
    suite: tuple[Path, dict[str, str]],
) -> None:
    """`make test PYTEST_ARGS="-m slow"`: the Makefile's -m "" first, the
    caller's last; each slow test runs once, in its own session."""
    folder, env = suite
    done = subprocess.run(argv(folder, "-m", "", "-m", "slow"), env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert marks(folder, "ran") == ["test_docker_slow", "test_other_slow"]


def test_ctrl_c_reaches_each_session_once_and_each_tears_down(
    suite: tuple[Path, dict[str, str]],
) -> None:
    folder, env = suite
    env.update(DOCKER_SLEEP="1", OTHER_SLEEP="1")
    proc = subprocess.Popen(argv(folder, "-m", "", "-k", "fails or passes"), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while len(marks(folder, "ran")) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(marks(folder, "ran")) == 2, "the two tests never started"
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole group
    out, _ = proc.communicate(timeout=50)  # not the tests' 60 s sleeps
    assert proc.returncode == 130, out
    assert marks(folder, "torn-down") == ["test_docker_fails", "test_other_passes"], out
    assert not list((folder / "tmp").iterdir())


def test_exitfirst_stops_the_other_session(suite: tuple[Path, dict[str, str]]) -> None:
    """-x: the other tests' failure interrupts the docker session, asleep
    in its test (which tears down)."""
    folder, env = suite
    env.update(DOCKER_SLEEP="1", OTHER_FAILS="1")
    done = subprocess.run(argv(folder, "-m", "", "-x", "-k", "fails or passes"), env=env,
                          capture_output=True, text=True, timeout=50)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "test_docker_fails" in marks(folder, "torn-down"), done.stdout


@pytest.mark.parametrize("option", ["--pdb", "-s", "--junitxml={}/report.xml", "--basetemp={}/bt"])
def test_options_that_need_the_terminal_or_name_one_output_keep_one_session(
    suite: tuple[Path, dict[str, str]], option: str
) -> None:
    folder, env = suite
    done = subprocess.run(argv(folder, "-m", "slow", option.format(folder)), env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "docker tests" not in done.stdout
    assert "2 passed, 2 deselected" in done.stdout, done.stdout


def test_no_docker_is_one_plain_session(suite: tuple[Path, dict[str, str]]) -> None:
    folder, env = suite
    (folder / "bin" / "docker").write_text("#!/bin/sh\nexit 1\n")
    done = subprocess.run(argv(folder, "-m", "not docker"), env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "docker tests" not in done.stdout and "2 passed, 2 deselected" in done.stdout
