"""The task commands, run for real with bash, and their parsers on
recorded output. A small stand-in `trainer` package plays the program so
that each behaviour (listen, exit with a code, die early) is certain."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra import commands, facts
from infra.transport import NodeLayout

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


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, NodeLayout]:
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


def bash(home: Path, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script], cwd=home, capture_output=True, text=True, timeout=60
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_start_wait_status_stop(node: tuple[Path, NodeLayout]) -> None:
    home, layout = node
    port = free_port()
    started = bash(home, commands.start_task(layout, "ps-0", [f"listen:{port}"], {"X": "a b"}))
    assert started.returncode == 0, started.stderr
    pid = facts.parse_started(started.stdout)
    assert pid is not None

    ready = bash(home, commands.wait_ports(layout, {"ps-0": port}, timeout=30))
    assert facts.parse_readiness(ready.stdout) == {"ps-0": "ready"}

    again = bash(home, commands.start_task(layout, "ps-0", [f"listen:{port}"], {}))
    assert again.returncode == 3 and "already running" in again.stderr

    status = facts.parse_task_status(bash(home, commands.task_status(layout, ["ps-0"])).stdout)
    assert status["ps-0"].alive and status["ps-0"].pid == pid and status["ps-0"].exit_code is None

    stopped = bash(home, commands.stop_tasks(layout, ["ps-0"], grace=5))
    assert stopped.stdout.split() == ["stopped", "ps-0"]
    status = facts.parse_task_status(bash(home, commands.task_status(layout, ["ps-0"])).stdout)
    assert not status["ps-0"].alive
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(pid, 0)


def test_task_that_dies_is_reported_dead_not_waited_for(node: tuple[Path, NodeLayout]) -> None:
    home, layout = node
    bash(home, commands.start_task(layout, "worker-0", ["exit:4"], {}))
    began = time.monotonic()
    ready = bash(home, commands.wait_ports(layout, {"worker-0": free_port()}, timeout=60))
    assert facts.parse_readiness(ready.stdout) == {"worker-0": "dead"}
    assert time.monotonic() - began < 20


def test_follow_log_streams_until_exit_and_reports_code(node: tuple[Path, NodeLayout]) -> None:
    home, layout = node
    bash(home, commands.start_task(layout, "chief-0", ["exit:7"], {}))
    out = bash(home, commands.follow_log(layout, "chief-0")).stdout.splitlines()
    assert out[0] == "hello from exit"
    assert out[-1] == "@tfcluster-exit 7"
    assert facts.is_exit_marker(out[-1]) and facts.parse_exit_marker(out[-1]) == 7
    assert any(line.startswith("@tfcluster {") for line in out)


def test_killed_task_has_no_exit_code(node: tuple[Path, NodeLayout]) -> None:
    home, layout = node
    bash(home, commands.start_task(layout, "chief-0", ["sleep:60"], {}))
    bash(home, commands.stop_tasks(layout, ["chief-0"], grace=5))
    last = bash(home, commands.follow_log(layout, "chief-0")).stdout.splitlines()[-1]
    assert facts.is_exit_marker(last) and facts.parse_exit_marker(last) is None


def test_tail_logs_names_each_task(node: tuple[Path, NodeLayout]) -> None:
    home, layout = node
    bash(home, commands.start_task(layout, "chief-0", ["exit:0"], {}))
    bash(home, commands.start_task(layout, "ps-0", ["exit:0"], {}))
    time.sleep(1.5)
    out = bash(home, commands.tail_logs(layout, 10, follow=False)).stdout
    pairs = list(facts.parse_tail(out))
    assert ("chief-0", "hello from exit") in pairs and ("ps-0", "hello from exit") in pairs


def test_parsers_on_recorded_output() -> None:
    assert facts.parse_started("started 4242\n") == 4242
    assert facts.parse_started("bash: setsid: command not found\n") is None
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
