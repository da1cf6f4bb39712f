"""The task commands, run for real with bash, and their parsers on
recorded output. A small stand-in `trainer` package plays the program so
that each behaviour (listen, exit with a code, die early) is certain."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.node import commands, facts
from infra.transport.base import NodeLayout
from tests.ports import free_port, free_ports
from tests.procs import runs

STAND_IN = '''
import socket, sys, time
args = sys.argv[1:]
what, _, value = args[0].partition(":")
print("hello from", what, flush=True)
if what == "listen":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(value))); s.listen(); time.sleep(600)
elif what == "exit":
    print('@tfcluster {"event": "done", "summary": {}}', flush=True)
    sys.exit(int(value))
elif what == "sleep":
    time.sleep(float(value))
'''


PR_SET_CHILD_SUBREAPER = 36


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Path, NodeLayout]]:
    home = tmp_path / "home"
    code = tmp_path / "code" / "trainer"
    code.mkdir(parents=True)
    home.mkdir()
    (code / "__init__.py").write_text("")
    (code / "__main__.py").write_text(STAND_IN)
    layout = NodeLayout(
        root="tf", code=str(code.parent), python=sys.executable, runs="tf/runs", logs="tf/logs"
    )
    yield home, layout
    # Whatever a test left running is stopped: no process outlives the test.
    logs = home / "tf" / "logs"
    names = [p.stem for p in logs.glob("*.pid")] if logs.exists() else []
    if names:
        bash(home, commands.stop_tasks(layout, names, grace=1))


def start(
    layout: NodeLayout, task: str, args: list[str], env: dict[str, str] | None = None
) -> str:
    """The stand-in trainer as the built-in program is started."""
    argv = ["python", "-m", "trainer", *args]
    return commands.start_task(
        layout, task, argv, env or {}, path_env={"PYTHONPATH": layout.code}
    )


def bash(home: Path, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script], cwd=home, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def slow_reaper() -> Iterator[None]:
    """The processes that a task leaves (it outlives the shell that started
    it) become this test process's children, which it does not reap while
    the test runs: the zombies that a container's or microVM's init leaves
    for seconds, here for certain (PR_SET_CHILD_SUBREAPER)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        pytest.skip("prctl(PR_SET_CHILD_SUBREAPER) is not available")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass


def test_start_wait_status_stop(node: tuple[Path, NodeLayout]) -> None:
    home, layout = node
    port = free_port()
    started = bash(home, start(layout, "ps-0", [f"listen:{port}"], {"X": "a b"}))
    assert started.returncode == 0, started.stderr
    pid = facts.parse_started(started.stdout)["ps-0"]

    ready = bash(home, commands.wait_ports(layout, {"ps-0": port}, timeout=30))
    assert facts.parse_readiness(ready.stdout) == {"ps-0": "ready"}

    again = bash(home, start(layout, "ps-0", [f"listen:{port}"], {}))
    assert again.returncode == 3 and "already running" in again.stderr

    status = facts.parse_task_status(bash(home, commands.task_status(layout, ["ps-0"])).stdout)
    assert status["ps-0"].alive and status["ps-0"].pid == pid and status["ps-0"].exit_code is None

    stopped = bash(home, commands.stop_tasks(layout, ["ps-0"], grace=5))
    assert stopped.stdout.split() == ["stopped", "ps-0"]
    status = facts.parse_task_status(bash(home, commands.task_status(layout, ["ps-0"])).stdout)
    assert not status["ps-0"].alive
    assert not runs(pid)


def test_task_that_dies_is_reported_dead_not_waited_for(node: tuple[Path, NodeLayout]) -> None:
    home, layout = node
    bash(home, start(layout, "worker-0", ["exit:4"], {}))
    began = time.monotonic()
    ready = bash(home, commands.wait_ports(layout, {"worker-0": free_port()}, timeout=60))
    assert facts.parse_readiness(ready.stdout) == {"worker-0": "dead"}
    assert time.monotonic() - began < 20


def test_follow_log_streams_until_exit_and_reports_code(node: tuple[Path, NodeLayout]) -> None:
    home, layout = node
    bash(home, start(layout, "chief-0", ["exit:7"], {}))
    out = bash(home, commands.follow_log(layout, "chief-0")).stdout.splitlines()
    assert out[0] == "hello from exit"
    assert out[-1] == "@tfcluster-exit 7"
    assert facts.is_exit_marker(out[-1]) and facts.parse_exit_marker(out[-1]) == 7
    assert any(line.startswith("@tfcluster {") for line in out)


def test_a_task_left_as_a_zombie_is_not_waited_for(
    node: tuple[Path, NodeLayout], slow_reaper: None
) -> None:
    # Its end is seen (follow_log returns) and a stop does not wait out the
    # grace for it: a zombie runs nothing. Both waited until the zombie was
    # reaped (forever here; seconds under a slow init, at every job's end).
    home, layout = node
    bash(home, start(layout, "chief-0", ["exit:5"], {}))
    out = bash(home, commands.follow_log(layout, "chief-0")).stdout.splitlines()
    assert out[-1] == "@tfcluster-exit 5"
    started = bash(home, start(layout, "ps-0", ["sleep:600"], {}))
    pid = facts.parse_started(started.stdout)["ps-0"]
    began = time.monotonic()
    stopped = bash(home, commands.stop_tasks(layout, ["ps-0"], grace=40))
    assert stopped.stdout.split() == ["stopped", "ps-0"]
    assert time.monotonic() - began < 20  # not the grace: it ended at once
    assert not runs(pid)


def test_a_follow_cut_off_leaves_nothing_polling(node: tuple[Path, NodeLayout]) -> None:
    # A Ctrl-C or a dropped SSH session kills the follow's shell: its tail
    # and its watcher must end with it, not poll until the task ends.
    home, layout = node
    bash(home, start(layout, "chief-0", ["sleep:120"], {}))
    follow = subprocess.Popen(
        ["bash", "-c", commands.follow_log(layout, "chief-0")],
        cwd=home, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert follow.stdout is not None
    assert follow.stdout.readline().strip() == "hello from sleep"

    def followers() -> list[str]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            text = " ".join(a.decode(errors="replace") for a in argv)
            ours = str(home) in text or str(layout.logs) in text
            if ours and ("alive_pid" in text or argv[0].endswith(b"tail")):
                found.append(text[:80])
        return found

    assert followers()
    follow.kill()
    follow.wait()
    deadline = time.monotonic() + 10
    while followers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert followers() == []


def test_killed_task_has_no_exit_code(node: tuple[Path, NodeLayout]) -> None:
    home, layout = node
    bash(home, start(layout, "chief-0", ["sleep:60"], {}))
    bash(home, commands.stop_tasks(layout, ["chief-0"], grace=5))
    last = bash(home, commands.follow_log(layout, "chief-0")).stdout.splitlines()[-1]
    assert facts.is_exit_marker(last) and facts.parse_exit_marker(last) is None


def test_tail_logs_names_each_task(node: tuple[Path, NodeLayout]) -> None:
    home, layout = node
    bash(home, start(layout, "chief-0", ["exit:0"], {}))
    bash(home, start(layout, "ps-0", ["exit:0"], {}))
    time.sleep(1.5)
    out = bash(home, commands.tail_logs(layout, 10, follow=False)).stdout
    pairs = list(facts.parse_tail(out))
    assert ("chief-0", "hello from exit") in pairs and ("ps-0", "hello from exit") in pairs


def test_parsers_on_recorded_output() -> None:
    assert facts.parse_started("started ps-0 4242\nstarted worker-0 17\n") == {
        "ps-0": 4242,
        "worker-0": 17,
    }
    assert facts.parse_started("bash: setsid: command not found\n") == {}
    assert facts.parse_stopped("stopped ps-0\nnoise\nstopped chief-0\n") == ["ps-0", "chief-0"]
    assert facts.parse_readiness("ready ps-0\ntimeout worker-1\njunk\n") == {
        "ps-0": "ready",
        "worker-1": "timeout",
    }
    status = facts.parse_task_status("ps-0 12 1 -\nworker-0 - 0 -\nchief-0 99 0 137\n")
    assert status["ps-0"] == facts.TaskStatus("ps-0", 12, True, None)
    assert status["worker-0"] == facts.TaskStatus("worker-0", None, False, None)
    assert status["chief-0"].exit_code == 137
    recorded = "==> chief-0.log <==\nline a\n\n==> ps-0.log <==\nline b\n"
    assert list(facts.parse_tail(recorded)) == [
        ("chief-0", "line a"),
        ("chief-0", ""),
        ("ps-0", "line b"),
    ]


def test_any_program_is_supervised_in_its_folder_with_its_env(
    node: tuple[Path, NodeLayout], tmp_path: Path
) -> None:
    """A user's program (no `-m trainer` on its command line) is started in
    its working folder, seen alive while it runs and stopped; its env values
    arrive literally and its run folder exists."""
    home, layout = node
    work = tmp_path / "work dir"
    work.mkdir()
    script = "import os, time; print(os.getcwd(), os.environ['X'], flush=True); time.sleep(600)"
    started = bash(
        home,
        commands.start_task(
            layout,
            "worker-0",
            ["python", "-c", script],
            {"X": "$(touch pwned) 'q'"},
            cwd=str(work),
            run_dir="tf/runs/r1",
        ),
    )
    assert started.returncode == 0, started.stderr
    assert (home / "tf" / "runs" / "r1").is_dir()
    status = facts.parse_task_status(bash(home, commands.task_status(layout, ["worker-0"])).stdout)
    assert status["worker-0"].alive
    time.sleep(1)
    log = (home / "tf" / "logs" / "worker-0.log").read_text()
    assert log.strip() == f"{work} $(touch pwned) 'q'"
    assert not (home / "pwned").exists() and not (work / "pwned").exists()
    stopped = bash(home, commands.stop_tasks(layout, ["worker-0"], grace=5))
    assert facts.parse_stopped(stopped.stdout) == ["worker-0"]


def test_missing_working_folder_is_exit_4(node: tuple[Path, NodeLayout], tmp_path: Path) -> None:
    home, layout = node
    result = bash(
        home, commands.start_task(layout, "chief-0", ["true"], {}, cwd=str(tmp_path / "nope"))
    )
    assert result.returncode == 4 and "no working folder" in result.stderr


def test_a_reused_pid_is_not_the_task(node: tuple[Path, NodeLayout]) -> None:
    """After a reboot the pid in a pid file may belong to another process:
    the start time recorded beside it tells them apart."""
    home, layout = node
    logs = home / "tf" / "logs"
    logs.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "60"])
    try:
        (logs / "ps-0.pid").write_text(f"{other.pid} 1\n")  # started at another tick
        status = facts.parse_task_status(bash(home, commands.task_status(layout, ["ps-0"])).stdout)
        assert not status["ps-0"].alive
        again = bash(home, start(layout, "ps-0", ["sleep:60"]))
        assert again.returncode == 0, again.stderr  # not refused as "already running"
        assert other.poll() is None  # and the stranger was not stopped
        bash(home, commands.stop_tasks(layout, ["ps-0"], grace=5))
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_a_process_of_the_same_name_started_at_another_time_is_not_the_task(
    node: tuple[Path, NodeLayout],
) -> None:
    """The name in the environment alone is not enough: a process carrying
    TFCLUSTER_TASK=ps-0 (a task of another run, or a child it left) at the
    pid of a pid file written for a process started at another tick is not
    that task, and is neither reported alive nor stopped."""
    home, layout = node
    logs = home / "tf" / "logs"
    logs.mkdir(parents=True)
    other = subprocess.Popen(["env", "TFCLUSTER_TASK=ps-0", "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while b"TFCLUSTER_TASK=ps-0" not in Path(f"/proc/{other.pid}/environ").read_bytes():
            assert time.monotonic() < deadline  # env has exec'd sleep by now
            time.sleep(0.01)
        (logs / "ps-0.pid").write_text(f"{other.pid} 1\n")
        status = facts.parse_task_status(bash(home, commands.task_status(layout, ["ps-0"])).stdout)
        assert not status["ps-0"].alive
        bash(home, commands.stop_tasks(layout, ["ps-0"], grace=1))
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_the_first_death_ends_the_wait_for_the_others(node: tuple[Path, NodeLayout]) -> None:
    """A job with a dead task will not start: the wait for the tasks still
    starting ends at once, not at the (here hour-long) timeout."""
    home, layout = node
    bash(home, start(layout, "ps-0", ["sleep:600"], {}))  # alive, never listens
    bash(home, start(layout, "worker-0", ["exit:4"], {}))
    ps, worker = free_ports(2)
    ports = {"ps-0": ps, "worker-0": worker}
    ready = bash(home, commands.wait_ports(layout, ports, timeout=3600))  # bash(): 60 s at most
    assert facts.parse_readiness(ready.stdout) == {"ps-0": "timeout", "worker-0": "dead"}


def test_a_task_waited_for_reports_its_complete_lines(node: tuple[Path, NodeLayout]) -> None:
    """A task that prints and never listens: each poll gives its line count
    and its last complete lines (facts.parse_output), for a live line of it
    and its output as it comes; a task that is ready or dead gives none."""
    home, layout = node
    bash(home, start(layout, "worker-0", ["sleep:600"], {}))
    bash(home, start(layout, "ps-0", ["exit:4"], {}))
    log = home / layout.logs / "worker-0.log"
    worker, ps = free_ports(2)
    ports = {"worker-0": worker}
    got = facts.parse_output(bash(home, commands.wait_ports(layout, ports, timeout=1)).stdout)
    assert got == {"worker-0": (1, ["hello from sleep"])}
    with log.open("a") as f:
        f.write("".join(f"line {i}\n" for i in range(30)) + "half a line")
    polled = bash(home, commands.wait_ports(layout, {**ports, "ps-0": ps}, timeout=1))
    assert facts.parse_readiness(polled.stdout)["ps-0"] == "dead"
    count, lines = facts.parse_output(polled.stdout)["worker-0"]
    assert count == 31 and len(lines) == commands.OUTPUT_LINES
    assert lines[-1] == "line 29" and lines[0] == f"line {30 - commands.OUTPUT_LINES}"
    bash(home, commands.stop_tasks(layout, ["worker-0"], grace=5))


def test_a_tasks_output_cannot_speak_for_the_wait(node: tuple[Path, NodeLayout]) -> None:
    """A task's lines are after the wait's own in its output: a line of the
    task's with a carriage return (a progress bar's) or another character
    Python's splitlines splits at once made `ready ps-0` or `dead worker-0`
    lines of the wait's own, a task still starting taken for ready (or a
    live one for dead). Only the wait's lines say, and the task's line
    comes whole."""
    home, layout = node
    bash(home, start(layout, "worker-0", ["sleep:600"], {}))
    log = home / layout.logs / "worker-0.log"
    with log.open("a") as f:
        f.write("epoch 1/3\rready worker-0\n\x1cdead worker-0\x85lines worker-0 999\n")
    polled = bash(home, commands.wait_ports(layout, {"worker-0": free_port()}, timeout=1))
    assert facts.parse_readiness(polled.stdout) == {"worker-0": "timeout"}
    count, lines = facts.parse_output(polled.stdout)["worker-0"]
    assert count == 3 and lines[0] == "hello from sleep", lines
    assert lines[-1] == "dead worker-0lines worker-0 999", lines
    bash(home, commands.stop_tasks(layout, ["worker-0"], grace=5))


def test_output_lines_are_data() -> None:
    got = facts.parse_output(
        "lines worker-0 2\n@log worker-0 \x1b[2Jhi\n@log worker-0 \n@log ps-0 x\nlines ps-0 ²\n"
    )
    assert got == {"worker-0": (2, ["hi", ""])}


def test_node_numbers_python_cannot_read_are_unknown() -> None:
    # str.isdigit() takes "²" and "١", int() refuses them: a crash once.
    assert facts.parse_exit_marker(facts.EXIT_MARKER + "²") is None
    assert facts.parse_exit_marker(facts.EXIT_MARKER + "-١") is None
    assert facts.parse_exit_marker(facts.EXIT_MARKER + "9" * 5000) is None
    assert facts.parse_task_status("ps-0 ² 1 ³\n")["ps-0"] == facts.TaskStatus(
        "ps-0", None, True, None
    )
