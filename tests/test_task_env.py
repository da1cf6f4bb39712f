"""The user's environment values reach the tasks through a file only the
user can read, never a command line (infra/node/task_env.py): while a job
starts and runs, no process's /proc/PID/cmdline holds them, and the task
sees them, literally."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from deploy import cli
from infra.node import commands, facts, task_env
from infra.providers.local import LocalTransport
from infra.transport.base import NodeLayout
from tests.procs import CmdlineWatch, none_left_in

REPO = Path(__file__).resolve().parents[1]
# Hostile on purpose: shell syntax, quotes, a line break, markup.
SECRET = "tok-3f9a $(touch pwned) `id` 'q' \"d\"\nline2 [red]x[/]"
# Prints what it got; a job's worker then listens on its TF_CONFIG port
# (as a TF server would) until stopped, a chief ends after $HOLD seconds.
PRINT_ENV = """\
import json, os, socket, time
names = ('USER_TOKEN', 'YAML_TOKEN', 'H', 'IFS')
print(json.dumps({n: os.environ.get(n) for n in names}), flush=True)
task = json.loads(os.environ.get('TF_CONFIG', '{}')).get('task', {'type': 'chief'})
if task['type'] != 'chief':
    config = json.loads(os.environ['TF_CONFIG'])['cluster']
    server = socket.socket()
    server.bind(('127.0.0.1', int(config[task['type']][task['index']].rsplit(':', 1)[1])))
    server.listen()
time.sleep(float(os.environ.get('HOLD', '0')))
"""


def test_a_task_gets_its_values_from_a_private_file(tmp_path: Path) -> None:
    homes = tmp_path / "nodes"
    (homes / "pc-1").mkdir(parents=True)
    home = homes / "pc-1"
    transport = LocalTransport(["pc-1"], homes)
    layout = transport.layout("pc-1")
    values = {"USER_TOKEN": SECRET, "H": "/elsewhere", "IFS": "x"}
    with CmdlineWatch("tok-3f9a") as watch:
        path = task_env.put(transport, "pc-1", "r1", values)
        assert path == "tfcluster/env/r1.env"
        written = home / path
        assert stat.S_IMODE(written.stat().st_mode) == 0o600
        assert stat.S_IMODE(written.parent.stat().st_mode) == 0o700
        assert not [p for p in written.parent.iterdir() if p != written]  # no temp left
        script = "\n".join(
            [
                *commands.remove_on_exit(path),
                commands.start_task(
                    layout, "worker-0", ["python", "-c", PRINT_ENV], {"HOLD": "3"},
                    env_file=path,
                ),
            ]
        )  # fmt: skip
        done = subprocess.run(["bash", "-c", script], cwd=home, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        pid = facts.parse_started(done.stdout)["worker-0"]
        assert not written.exists()  # removed once the task had it
        log = home / "tfcluster" / "logs" / "worker-0.log"
        deadline = time.monotonic() + 30
        while not log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)  # and while it runs
    assert watch.passes > 1 and watch.seen == [], watch.seen
    # Literally, and the start script's own H and IFS took no harm: the
    # task started where it should, with its log and pid file in place.
    # (IFS itself never reaches a program through bash, which resets it.)
    got = json.loads(log.read_text().splitlines()[0])
    assert got["USER_TOKEN"] == SECRET and got["H"] == "/elsewhere"
    assert (home / "tfcluster" / "logs" / "worker-0.pid").read_text().split()[0] == str(pid)
    assert not list(tmp_path.rglob("pwned"))
    subprocess.run(
        ["bash", "-c", commands.stop_tasks(layout, ["worker-0"], grace=1)], cwd=home, check=True
    )


def test_a_missing_env_file_is_a_refused_start_not_a_task_without_it(tmp_path: Path) -> None:
    layout = NodeLayout(root="tf", code="c", python=sys.executable, runs="tf/r", logs="tf/l")
    script = commands.start_task(layout, "worker-0", ["true"], {}, env_file="tf/env/gone.env")
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 5 and "no environment file for worker-0" in done.stderr


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "my project"
    folder.mkdir()
    (folder / "print_env.py").write_text(PRINT_ENV)
    shutil.copy(REPO / "tests" / "programs" / "stand_in.py", folder / "stand_in.py")
    yield folder
    none_left_in(folder)


def test_run_keeps_env_values_out_of_every_command_line(
    workdir: Path, tmp_path: Path, tfcluster_home: Path
) -> None:
    """`run --env` and cluster.yaml's job.env on the local cluster: while
    the job starts and runs, no command line holds either value; every
    task sees both; no environment file is left on a node."""
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "name: envs\nprovider: local\nnodes: [pc-1, pc-2]\n"
        "roles: {ps: [], chief: pc-1, worker: [pc-2]}\n"
        "job:\n  mode: sync\n  workdir: my project\n  env: {YAML_TOKEN: yaml-7c21e}\n"
    )
    dest = tmp_path / "results"
    with CmdlineWatch("tok-3f9a", "yaml-7c21e") as watch:
        result = CliRunner().invoke(
            cli,
            ["--config", str(config), "run", "--dest", str(dest), "--env", f"USER_TOKEN={SECRET}",
             "--env", "HOLD=3", "--", "python", "print_env.py"],
            catch_exceptions=False,
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert watch.passes > 1 and watch.seen == [], watch.seen
    line = next(x for x in result.output.splitlines() if x.startswith("{"))
    got = json.loads(line)
    assert got["USER_TOKEN"] == SECRET and got["YAML_TOKEN"] == "yaml-7c21e"
    logs = tfcluster_home / "clusters" / "envs" / "nodes" / "pc-2" / "tfcluster" / "logs"
    worker = json.loads((logs / "worker-0.log").read_text().splitlines()[0])
    assert worker["USER_TOKEN"] == SECRET and worker["YAML_TOKEN"] == "yaml-7c21e"
    nodes = tfcluster_home / "clusters" / "envs" / "nodes"
    assert not [p for p in nodes.rglob("env/*") if p.is_file()]


@pytest.mark.parametrize(
    ("where", "value", "said"),
    [
        ("yaml", "abc\\0PATH=/nonexistent", "its value holds a NUL character"),
        ("yaml", "a" * 140_000, "its value is over 128 KiB"),
        ("flag", "a" * 140_000, "its value is over 128 KiB"),
    ],
)
def test_a_value_no_environment_can_hold_is_one_line_before_anything_starts(
    where: str, value: str, said: str, workdir: Path, tmp_path: Path
) -> None:
    """A NUL in a job.env value (YAML's "\\0") ended its entry in the
    values' file and made the rest one of its own: PATH, which is
    reserved, set for every task (`setsid: not found`, exit 9). A value
    past Linux's 128 KiB for one variable failed every task's start with
    'Argument list too long' and 'Success'. Each is now refused in one
    line, exit 2, before any task starts."""
    env = f'{{LONG: "{value}"}}' if where == "yaml" else "{}"
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "name: badenv\nprovider: local\nnodes: [pc-1]\n"
        "roles: {ps: [], chief: pc-1, worker: []}\n"
        f"job:\n  mode: sync\n  workdir: my project\n  env: {env}\n"
    )
    flags = ["--env", f"LONG={value}"] if where == "flag" else []
    result = CliRunner().invoke(
        cli, ["--config", str(config), "run", *flags, "--", "python", "print_env.py"]
    )
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: ") and said in line and "LONG" in line, line
    assert len(line) < 400
