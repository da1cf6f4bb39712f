"""`deploy.py run`, `exec` and the working-folder sync on the compose
cluster: real sshd containers, the node image's baked venv, driven by
``deploy.py`` as a user would.

Three of the four compose nodes are used (pc-1: chief and ps, pc-2 and
pc-3: workers) to keep the module light on a small machine. After every
test no task process may be left on any node (the ``no_task_left``
finalizer looks with ``pgrep`` inside each container).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from infra.node import facts
from infra.node.autostop_commands import autostop_status
from infra.transport.base import NodeLayout
from tests.docker.conftest import REPO, ComposeCluster, cluster_root, config_file
from tests.procs import CmdlineWatch

pytestmark = pytest.mark.docker

NODES = ["pc-1", "pc-2", "pc-3"]
# What a task of these tests runs; none may outlive its test.
TASK_PATTERN = "ps_program|collective_program|listen[.]py|sys[.]exit|no-such-command"

# A program for the sync and failure tests that needs no TensorFlow: the ps
# and worker tasks listen on their TF port (what `run` waits for) until they
# are stopped; the chief exits after $CHIEF_SLEEP seconds, with $CHIEF_EXIT,
# listening on its own port meanwhile with CHIEF_LISTENS=1 (as the TF server
# of a chief under ParameterServerStrategy does).
LISTEN = """\
import json, os, socket, sys, time

config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
port = int(config["cluster"][task["type"]][task["index"]].rsplit(":", 1)[1])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if task["type"] == "chief":
    if os.environ.get("CHIEF_LISTENS"):
        server.bind(("0.0.0.0", port))
        server.listen()
    print("chief ran in", os.getcwd(), os.environ.get("USER_TOKEN", ""), flush=True)
    time.sleep(float(os.environ.get("CHIEF_SLEEP", "0")))
    sys.exit(int(os.environ.get("CHIEF_EXIT", "0")))
server.bind(("0.0.0.0", port))
server.listen()
time.sleep(600)
"""


@pytest.fixture(scope="module")
def cluster_yaml(
    compose_cluster: ComposeCluster,
    node_key: tuple[Path, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """examples/compose.yaml on this run's ports, three nodes, no data sync."""
    data = compose_cluster.config("runtest", node_key[0], NODES)
    data["roles"] = {"ps": "pc-1", "chief": "pc-1", "worker": ["pc-2", "pc-3"]}
    return config_file(tmp_path_factory.mktemp("run-config"), data)


class Deploy:
    """``deploy(*args)``: ``deploy.py --config <cluster_yaml> ARGS``."""

    def __init__(self, config: Path, home: Path) -> None:
        self.config = config
        self.home = home
        self.env = dict(os.environ, TFCLUSTER_HOME=str(home), COLUMNS="250")

    def popen(self, *args: str) -> subprocess.Popen[str]:
        argv = [sys.executable, str(REPO / "deploy.py"), "--config", str(self.config), *args]
        return subprocess.Popen(
            argv, cwd=self.home, env=dict(self.env, PYTHONUNBUFFERED="1"), text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def root(self) -> str:
        """The cluster's folder on its nodes (``tfcluster/<name>-<id>``)."""
        return cluster_root(self.config, self.home)

    def __call__(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, str(REPO / "deploy.py"), "--config", str(self.config), *args]
        return subprocess.run(
            argv, cwd=self.home, env=self.env, capture_output=True, text=True,
            timeout=timeout, stdin=subprocess.DEVNULL,
        )  # fmt: skip


@pytest.fixture(scope="module")
def deploy(cluster_yaml: Path, tmp_path_factory: pytest.TempPathFactory) -> Deploy:
    return Deploy(cluster_yaml, tmp_path_factory.mktemp("run-home"))


@pytest.fixture(scope="module")
def containers(compose_cluster: ComposeCluster) -> dict[str, str]:
    return {node: compose_cluster.container(node) for node in NODES}


def _left_tasks(containers: dict[str, str]) -> dict[str, str]:
    left = {}
    for node, container in containers.items():
        # pgrep as argv, not through a shell: no shell of ours matches the pattern.
        done = subprocess.run(
            ["docker", "exec", container, "pgrep", "-af", TASK_PATTERN],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        # 0: found some, 1: none; anything else (no container, no pgrep)
        # must not pass for "none".
        assert done.returncode in (0, 1), f"pgrep on {node} failed: {done.stderr}"
        if done.returncode == 0:
            left[node] = done.stdout.strip()
    return left


@pytest.fixture(autouse=True)
def no_task_left(containers: dict[str, str]) -> Iterator[None]:
    """After each test: no task process on any node (a few seconds' grace
    for processes being stopped)."""
    yield
    deadline = time.monotonic() + 10
    while (left := _left_tasks(containers)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"task processes left on the nodes: {left}"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A copy of examples/own-program, the user's working folder."""
    folder = tmp_path / "own-program"
    shutil.copytree(REPO / "examples" / "own-program", folder)
    (folder / "listen.py").write_text(LISTEN)
    return folder


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _result(dest: Path) -> dict:
    found = list(dest.glob("*/result.json"))
    assert len(found) == 1, f"expected one result.json under {dest}: {found}"
    return json.loads(found[0].read_text())


def test_ps_program(deploy: Deploy, workdir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "results"
    argv = ["run", "--workdir", str(workdir), "--dest", str(dest), "--", "python", "ps_program.py"]
    out = _ok(deploy(*argv, "--steps", "200"))
    result = _result(dest)
    assert abs(result["w"] - 3) < 0.1 and abs(result["b"] - 2) < 0.1, (result, out)
    assert result["steps"] == 200
    assert result["cluster"] == {"chief": 1, "ps": 1, "worker": 2}, result
    assert "ps-0@pc-1" in out and "worker-1@pc-3" in out and "chief-0@pc-1" in out, out


def test_collective_program_without_ps(deploy: Deploy, workdir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "results"
    argv = ["run", "--no-ps", "--workdir", str(workdir), "--dest", str(dest), "--", "python"]
    out = _ok(deploy(*argv, "collective_program.py", "--steps", "100"))
    result = _result(dest)
    assert result["cluster"] == {"chief": 1, "worker": 2}, result
    assert result["replicas"] == 3, result  # the workers and the chief
    assert result["accuracy"] >= 0.9, result
    assert "ps-0" not in out, out


def _sync_lines(stderr: str) -> dict[str, str]:
    """The per-node sync lines `-v` logs: node -> what was done."""
    found = dict(re.findall(r"sync (pc-\d): (.*?)\s*$", stderr, re.M))
    assert sorted(found) == NODES, stderr
    return found


def test_workdir_sync(deploy: Deploy, workdir: Path) -> None:
    # What must never reach a node, beside what must.
    (workdir / ".git").mkdir()
    (workdir / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (workdir / "venv" / "bin").mkdir(parents=True)
    (workdir / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (workdir / "venv" / "bin" / "python").write_text("#!/bin/sh\n")
    (workdir / "runs" / "old").mkdir(parents=True)
    (workdir / "runs" / "old" / "result.json").write_text("{}")
    (workdir / "__pycache__").mkdir()
    (workdir / "__pycache__" / "listen.cpython-311.pyc").write_bytes(b"\0")
    (workdir / ".gitignore").write_text("secret.txt\n*.log\n")
    (workdir / "secret.txt").write_text("not for the nodes\n")
    (workdir / "train.log").write_text("local log\n")
    (workdir / "sub").mkdir()
    (workdir / "sub" / "data.txt").write_text("version 1\n")
    (workdir / "gone.txt").write_text("deleted below\n")
    # One path per line in the sync's manifest: such a name cannot travel.
    (workdir / "new\nline.txt").write_text("left out, with a warning\n")
    # six is in the node venv (a TensorFlow dependency), so pip needs no
    # index; the comment makes the content, hence the install marker, new.
    (workdir / "requirements.txt").write_text(f"six\n# {secrets.token_hex(4)}\n")

    first = deploy("-v", "run", "--workdir", str(workdir), "--", "python", "listen.py")
    _ok(first)
    # In the cluster's own folder on the login (tfcluster/<name>-<id>).
    ran_in = re.findall(r"chief ran in /home/tfcluster/tfcluster/([a-z0-9-]+-[0-9a-f]{12})/work ?$",
                        first.stdout, re.M)  # fmt: skip
    assert len(ran_in) == 1, first.stdout
    for node, line in _sync_lines(first.stderr).items():
        assert "installed requirements.txt" in line, (node, first.stderr)
    assert "not syncing 'new\\nline.txt': a line break in its name" in first.stderr

    (workdir / "sub" / "data.txt").write_text("version 2\n")
    (workdir / "gone.txt").unlink()
    second = deploy("-v", "run", "--workdir", str(workdir), "--", "python", "listen.py")
    _ok(second)
    for node, line in _sync_lines(second.stderr).items():
        # Only the changed file travels, the deleted one goes; nothing installed.
        assert line.startswith("synced 1 file (") and "deleted 1 via manifest" in line, (
            node,
            line,
        )
    assert "requirements" not in second.stderr + second.stdout, second.stderr

    probe = (
        "for p in .git venv runs __pycache__ secret.txt train.log gone.txt; do "
        'test -e "$p" && echo "present $p"; done; '
        "test -f .gitignore && test -f requirements.txt && test -f listen.py && echo checked; "
        "cat sub/data.txt"
    )
    out = _ok(deploy("exec", "--workdir", str(workdir), "--", "sh", "-c", probe))
    for node in NODES:
        assert f"{node} | checked" in out and f"{node} | version 2" in out, out
    assert "present" not in out, out
    listing = _ok(deploy("exec", "--node", "pc-2", "--workdir", str(workdir), "--", "ls", "-a"))
    names = {line.split(" | ", 1)[1] for line in listing.splitlines()}
    # What the working folder holds (examples/own-program's files, listen.py,
    # sub/), less what its filter keeps back.
    kept = {p.name for p in (REPO / "examples" / "own-program").iterdir()} - {"__pycache__"}
    assert names == {".", "..", ".gitignore", "listen.py", "requirements.txt", "sub"} | kept, listing
    assert {"ps_program.py", "collective_program.py"} <= names, listing

    # A folder becomes a file, a file a folder: the next sync still works
    # (it once failed in tar, for good), and no emptied folder stays.
    shutil.rmtree(workdir / "sub")
    (workdir / "sub").write_text("now a file\n")
    (workdir / "listen.py").unlink()
    (workdir / "listen.py").mkdir()
    (workdir / "listen.py" / "x.txt").write_text("now a folder\n")
    out = _ok(
        deploy("exec", "--workdir", str(workdir), "--", "sh", "-c", "cat sub listen.py/x.txt")
    )
    for node in NODES:
        assert f"{node} | now a file" in out and f"{node} | now a folder" in out, out


def test_exec_runs_on_every_node(deploy: Deploy, workdir: Path) -> None:
    version = "import tensorflow as tf; print(tf.__version__)"
    out = _ok(deploy("exec", "--workdir", str(workdir), "--", "python", "-c", version))
    versions = re.findall(r"^(pc-\d) \| (\d+\.\d+\.\d+)\s*$", out, re.M)
    assert sorted(node for node, _ in versions) == NODES, out
    assert len({version for _, version in versions}) == 1, out


def test_exec_failures(deploy: Deploy, workdir: Path) -> None:
    one = deploy("exec", "--node", "pc-2", "--workdir", str(workdir), "--", "false")
    assert one.returncode != 0
    errors = [line for line in one.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: failed on 1 of 1 node(s): pc-2 exit 1"], one.stderr

    every = deploy("exec", "--workdir", str(workdir), "--", "sh", "-c", "exit 3")
    assert every.returncode == 3, every.stderr
    assert "failed on 3 of 3 node(s): pc-1 exit 3, pc-2 exit 3, pc-3 exit 3" in every.stderr


def test_failing_programs(deploy: Deploy, workdir: Path) -> None:
    # Every task exits 7 before it listens: the readiness check says so,
    # with the dead task's code.
    dead = deploy("run", "--workdir", str(workdir), "--", "python", "-c", "import sys; sys.exit(7)")
    assert dead.returncode == 7, dead.stdout + dead.stderr
    assert "exited before it listened on its port" in dead.stderr, dead.stderr

    missing = deploy("run", "--workdir", str(workdir), "--", "no-such-command")
    assert missing.returncode == 127, missing.stdout + missing.stderr

    # The others up and listening, the chief fails: its code comes back and
    # the listening tasks are stopped (the finalizer checks).
    chief = deploy(
        "run", "--env", "CHIEF_EXIT=7", "--workdir", str(workdir), "--", "python", "listen.py"
    )
    assert chief.returncode == 7, chief.stdout + chief.stderr
    assert "the chief exited with code 7" in chief.stderr, chief.stderr


def test_detached_run_is_cancelled(deploy: Deploy, workdir: Path) -> None:
    """`run --detach` returns at once; `cancel` stops every task (the
    finalizer checks no process is left)."""
    argv = ["run", "--detach", "--env", "CHIEF_SLEEP=600", "--workdir", str(workdir)]
    started = _ok(deploy(*argv, "--", "python", "listen.py"))
    run_id = re.search(r"^job (\S+):", started, re.M)
    assert run_id and "started" in started, started
    again = deploy(*argv, "--", "python", "listen.py")
    assert again.returncode != 0 and run_id.group(1) in again.stderr, again.stderr
    cancelled = _ok(deploy("cancel"))
    assert f"cancelled {run_id.group(1)}: stopped" in cancelled, cancelled
    for task in ("ps-0", "worker-0", "worker-1", "chief-0"):
        assert task in cancelled, cancelled
    assert "nothing to stop" in _ok(deploy("cancel"))


def test_ctrl_c_stops_every_task(deploy: Deploy, workdir: Path) -> None:
    """Ctrl-C while `run` follows the job: every task on every node is
    stopped (the finalizer checks) and `run` says so."""
    proc = deploy.popen(
        "run", "--env", "CHIEF_SLEEP=600", "--workdir", str(workdir), "--", "python", "listen.py"
    )
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if "chief ran in" in line:
                break
        else:
            pytest.fail(f"run ended before the chief started: {''.join(seen)}")
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out = "".join(seen) + rest
    assert proc.returncode == 130, out
    assert "every task of the job was stopped" in out, out


def _on_node(containers: dict[str, str], node: str, script: str) -> str:
    """Bash on ``node`` as the cluster's login, in its home (where the
    commands of infra/ run)."""
    done = subprocess.run(
        ["docker", "exec", "-u", "tfcluster", "-w", "/home/tfcluster", containers[node],
         "bash", "-c", script],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("ending", ["exits", "is killed"])
def test_a_detached_jobs_tasks_end_with_its_chief(
    deploy: Deploy, workdir: Path, containers: dict[str, str], ending: str
) -> None:
    """`run --detach`, nobody attached: when the chief exits (or is killed
    with SIGKILL), the ps (on the chief's node: by the chief's pid file) and
    the workers (on the other nodes: by the chief's port, which stops
    answering) end by themselves within 10 s, and every node's idle check
    says idle. When each watch fired is read on the node: the mtime of the
    autostop idle clock it touches, against the chief's exit file."""
    root = deploy.root()
    assert root.startswith("tfcluster/runtest-"), root
    layout = NodeLayout(root, f"{root}/code", "tfcluster/venv/bin/python",
                        f"{root}/runs", f"{root}/logs")  # fmt: skip
    for node in NODES:
        _on_node(containers, node, f"mkdir -p {root}/autostop && touch -d '-1 hour' "
                 f"{root}/autostop/active")  # fmt: skip
    try:
        sleep = "4" if ending == "exits" else "600"
        argv = ["run", "--detach", "--env", f"CHIEF_SLEEP={sleep}", "--env", "CHIEF_LISTENS=1"]
        _ok(deploy(*argv, "--workdir", str(workdir), "--", "python", "listen.py"))
        if ending == "is killed":
            time.sleep(3)  # the workers' watches have seen the chief's port answer
            pid = _on_node(containers, "pc-1", f"read -r p t < {root}/logs/chief-0.pid; echo $p")
            chief_end = int(_on_node(containers, "pc-1", f"kill -KILL -- -{int(pid)}; date +%s"))
        deadline = time.monotonic() + 60
        while _left_tasks(containers) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _left_tasks(containers)
        if ending == "exits":
            chief_end = int(_on_node(containers, "pc-1", f"stat -c %Y {root}/logs/chief-0.exit"))
        for node in NODES:
            # Whole seconds on both sides: at most a second more than it took.
            fired = int(_on_node(containers, node, f"stat -c %Y {root}/autostop/active"))
            assert 0 <= fired - chief_end <= 10, (node, fired, chief_end)
            report = facts.parse_autostop(_on_node(containers, node, autostop_status(layout)))
            assert report is not None and not report.busy, (node, report)
        worker_log = _on_node(containers, "pc-2", f"cat {root}/logs/worker-0.log")
        assert "tfcluster: the chief at " in worker_log and "stopping worker-0" in worker_log
    finally:
        for node in NODES:
            _on_node(containers, node, f"rm -rf {root}/autostop")


def test_env_values_stay_out_of_command_lines(
    deploy: Deploy, workdir: Path, cluster_yaml: Path, tmp_path: Path
) -> None:
    """cluster.yaml's job.env on the compose cluster: while `run` starts
    and runs the job, no process here has the value in its command line
    (the nodes' processes are among them: containers share this kernel),
    and the tasks see it."""
    data = yaml.safe_load(cluster_yaml.read_text())
    data.setdefault("job", {})["env"] = {"USER_TOKEN": "tok-58c0d 'q' $(id)"}
    run = Deploy(config_file(tmp_path, data), deploy.home)
    with CmdlineWatch("tok-58c0d") as watch:
        out = _ok(run("run", "--env", "CHIEF_SLEEP=2", "--workdir", str(workdir),
                      "--", "python", "listen.py"))  # fmt: skip
    assert f"chief ran in /home/tfcluster/{deploy.root()}/work tok-58c0d 'q' $(id)" in out, out
    assert watch.passes > 1 and watch.seen == [], watch.seen
