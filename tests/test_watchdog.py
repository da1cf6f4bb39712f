"""A task's watch (infra/node/watchdog.py), run for real: bash, real processes,
a real listening socket for the chief's port. A watch ends its own task
once the chief has ended (however it ended), and nothing else; it never
ends a task whose chief it has not seen; it ends with its task."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infra.node import commands, facts
from infra.node.watchdog import Watch, renew_lease
from infra.transport.base import NodeLayout
from tests.procs import runs

LAYOUT = NodeLayout(
    root="tf", code="tf/code", python=sys.executable, runs="tf/runs", logs="tf/logs"
)
CHIEF_PID = "tf/logs/chief-0.pid"
# The task's end, once its chief has ended, within this (infra/node/watchdog.py:
# a few looks a second apart, then SIGTERM).
END_S = 10.0


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "home"
    folder.mkdir()
    yield folder
    logs = folder / "tf" / "logs"
    names = [p.stem for p in logs.glob("*.pid")] if logs.exists() else []
    if names:
        bash(folder, commands.stop_tasks(LAYOUT, names, grace=1))


def bash(home: Path, script: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["bash", "-c", script], cwd=home, capture_output=True, text=True, timeout=60
    )
    return done


def start(home: Path, task: str, argv: list[str], watch: Watch | None = None) -> int:
    """Start ``task`` of job ``r1``; its pid (the task's process group)."""
    script = commands.start_task(LAYOUT, task, argv, {"TFCLUSTER_RUN_ID": "r1"}, watch=watch)
    done = bash(home, script)
    assert done.returncode == 0, done.stderr
    return facts.parse_started(done.stdout)[task]


def group(pgid: int) -> list[int]:
    """The live processes of a process group."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[2] == str(pgid) and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def within(seconds: float, done: Callable[[], bool]) -> float | None:
    """Seconds until ``done()``, polled; None if not within ``seconds``."""
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        if done():
            return time.monotonic() - began
        time.sleep(0.1)
    return None


def log(home: Path, task: str) -> str:
    return (home / "tf" / "logs" / f"{task}.log").read_text()


def test_the_chiefs_end_ends_the_task_and_nothing_else(home: Path) -> None:
    """pid watch (the chief's node): the chief ends by itself; the task's
    whole group goes within END_S, says why in its log, and starts the
    autostop idle clock; a task without a watch (another group) stays."""
    (home / "tf" / "autostop").mkdir(parents=True)
    active = home / "tf" / "autostop" / "active"
    active.touch()
    os.utime(active, (1, 1))
    bystander = start(home, "worker-9", ["sleep", "600"])
    ps = start(home, "ps-0", ["sleep", "600"], Watch.chief_pid(CHIEF_PID, "r1"))
    chief = start(home, "chief-0", ["sleep", "2"])
    assert within(30, lambda: not runs(chief)) is not None
    took = within(END_S, lambda: not group(ps))
    assert took is not None, f"ps-0 still runs {END_S} s after its chief ended: {group(ps)}"
    assert "tfcluster: the chief ended; stopping ps-0" in log(home, "ps-0")
    assert active.stat().st_mtime > time.time() - 60  # idle from now on
    assert group(bystander)


def test_a_chief_killed_with_sigkill_ends_the_task(home: Path) -> None:
    ps = start(home, "ps-0", ["sleep", "600"], Watch.chief_pid(CHIEF_PID, "r1"))
    chief = start(home, "chief-0", ["sleep", "600"])
    time.sleep(1.5)  # the watch has seen it run
    assert group(ps)
    os.killpg(chief, signal.SIGKILL)
    assert within(END_S, lambda: not group(ps)) is not None, group(ps)


def test_a_chief_that_died_at_once_is_still_seen(home: Path) -> None:
    """Its pid file changed (the watch compares it with what it held
    before): a chief that never ran a second still ends the task."""
    ps = start(home, "ps-0", ["sleep", "600"], Watch.chief_pid(CHIEF_PID, "r1"))
    start(home, "chief-0", ["false"])
    assert within(END_S, lambda: not group(ps)) is not None, group(ps)


def test_a_process_that_reused_the_chiefs_pid_is_not_the_chief(home: Path) -> None:
    """The chief's pid taken by another process (its pid file then names a
    process that started at another tick): the chief is gone all the same,
    the task ends, and the stranger is neither taken for the chief nor
    signalled."""
    ps = start(home, "ps-0", ["sleep", "600"], Watch.chief_pid(CHIEF_PID, "r1"))
    chief = start(home, "chief-0", ["sleep", "600"])
    time.sleep(1.5)
    tick = (home / CHIEF_PID).read_text().split()[1]
    stranger = subprocess.Popen(["sleep", "600"])
    try:
        # As after the chief's death and its pid's reuse: the pid file's
        # pid runs, but is not the process that started at its tick.
        os.killpg(chief, signal.SIGKILL)
        (home / CHIEF_PID).write_text(f"{stranger.pid} {tick}\n")
        assert within(END_S, lambda: not group(ps)) is not None, group(ps)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_a_stale_pid_file_of_an_earlier_chief_is_not_this_jobs_chief(home: Path) -> None:
    """Before this job's chief starts, its pid file is the last job's (a
    dead chief): that is no reason to end the task."""
    old = start(home, "chief-0", ["true"])
    assert within(10, lambda: not runs(old)) is not None
    ps = start(home, "ps-0", ["sleep", "600"], Watch.chief_pid(CHIEF_PID, "r1"))
    time.sleep(4)
    assert group(ps), log(home, "ps-0")


def test_a_task_of_this_job_at_a_stale_pid_files_pid_is_not_its_chief(home: Path) -> None:
    """After a reboot (a Spot recovery restarts the job under the same run
    id) pids start over, and a task of this very job may get the pid that
    the last chief's pid file names. It carries this job's run id, but not
    that pid file's start tick: it is not the chief, and the watch must
    not take it for one that has ended (it ended the ps at once)."""
    twin = subprocess.Popen(
        ["sleep", "600"], env={**os.environ, "TFCLUSTER_RUN_ID": "r1"}, start_new_session=True
    )
    try:
        (home / CHIEF_PID).parent.mkdir(parents=True)
        (home / CHIEF_PID).write_text(f"{twin.pid} 1\n")  # the last boot's chief
        ps = start(home, "ps-0", ["sleep", "600"], Watch.chief_pid(CHIEF_PID, "r1"))
        time.sleep(5)
        assert group(ps), log(home, "ps-0")
        chief = start(home, "chief-0", ["sleep", "1"])  # this job's: ends the task
        assert within(30, lambda: not runs(chief)) is not None
        assert within(END_S, lambda: not group(ps)) is not None, group(ps)
        assert twin.poll() is None
    finally:
        twin.kill()
        twin.wait()


@pytest.fixture
def chief_port() -> Iterator[socket.socket]:
    """A listening socket playing the chief's TF server on another node."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server
    server.close()


def test_tcp_watch_ends_the_task_once_the_chief_stops_answering(
    home: Path, chief_port: socket.socket
) -> None:
    port = chief_port.getsockname()[1]
    worker = start(home, "worker-0", ["sleep", "600"], Watch.chief_port("127.0.0.1", port))
    time.sleep(3)  # it answered
    assert group(worker)
    chief_port.close()  # refused from now on
    assert within(END_S, lambda: not group(worker)) is not None, group(worker)
    assert "the chief at 127.0.0.1:" in log(home, "worker-0")


def test_tcp_watch_leaves_a_task_whose_chief_never_answered(home: Path) -> None:
    """A chief that never listens (a program whose chief uses no TF
    server) is never taken for gone: its task runs until stopped."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens here
    worker = start(home, "worker-0", ["sleep", "600"], Watch.chief_port("127.0.0.1", port))
    time.sleep(6)
    assert group(worker)
    bash(home, commands.stop_tasks(LAYOUT, ["worker-0"], grace=2))
    assert within(10, lambda: not group(worker)) is not None


def test_the_watch_ends_with_its_task(home: Path, chief_port: socket.socket) -> None:
    """Nothing of a task outlives it: not its watch (nor a probe of it),
    whether the program ends by itself or is stopped."""
    port = chief_port.getsockname()[1]
    done = start(home, "worker-0", ["sleep", "2"], Watch.chief_port("127.0.0.1", port))
    assert within(10, lambda: len(group(done)) >= 3) is not None  # wrapper, watch, program
    assert within(10, lambda: not group(done)) is not None, group(done)
    assert (home / "tf" / "logs" / "worker-0.exit").read_text().strip() == "0"
    stopped = start(home, "worker-1", ["sleep", "600"], Watch.chief_pid(CHIEF_PID, "r1"))
    bash(home, commands.stop_tasks(LAYOUT, ["worker-1"], grace=5))
    assert not group(stopped)


def test_a_lease_not_renewed_ends_the_task(home: Path) -> None:
    """TensorBoard's kind: alive while renewed, ended once the lease ran out."""
    lease = "tf/logs/board.lease"
    board = start(home, "board", ["sleep", "600"], Watch.lease(lease, 2))
    for _ in range(8):  # 4 s, twice the lease
        bash(home, "\n".join([commands.PRELUDE, renew_lease(commands.path(lease))]))
        time.sleep(0.5)
    assert group(board)
    assert within(END_S, lambda: not group(board)) is not None, group(board)
    assert "its lease ran out" in log(home, "board")
