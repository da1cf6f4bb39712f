"""The README's job commands on the local provider, for real (processes,
not mocks): `train --detach`, `logs` and `logs --follow`, `fetch`, `status`
as a table, `train -- <trainer flags>` after `job.args`, `$TFCLUSTER_CONFIG`,
a failed training exiting with the chief's own code, and `forget-host`.

CPU is scarce: one short async job (ps + worker + chief, 30 steps) serves
every assertion about a job that ran, and the failing job is a single
chief that stops before its first step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
import yaml
from click.testing import CliRunner

from deploy import cli
from infra.cluster.api import Cluster
from infra.config.loader import load_config

REPO = Path(__file__).resolve().parents[1]
STEPS = 30

CONFIG = {
    "name": "jobs",
    "provider": "local",
    "nodes": ["pc-1", "pc-2"],
    "roles": {"ps": "pc-1", "chief": "pc-1", "worker": "pc-2"},
    # --steps-per-call 5 (the default is 10) shows in summary.json.
    "job": {"mode": "async", "steps": STEPS, "checkpoint_every": STEPS, "batch_size": 32,
            "args": ["--seed", "7", "--steps-per-call", "5"]},
}  # fmt: skip


@pytest.fixture(scope="module")
def module_env(tmp_path_factory: pytest.TempPathFactory, mnist_dir: Path) -> Iterator[dict[str, str]]:
    """One state folder and one config (named by $TFCLUSTER_CONFIG, never
    --config) for the whole module: the job that ran is looked at by
    several tests."""
    root = tmp_path_factory.mktemp("jobs")
    config = root / "cluster.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    env = {
        "TFCLUSTER_HOME": str(root / "home"),
        "TFCLUSTER_CONFIG": str(config),
        "MNIST_DIR": str(mnist_dir),
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        yield env
        CliRunner().invoke(cli, ["cancel"])  # nothing outlives the module
        CliRunner().invoke(cli, ["down", "--yes"])


@pytest.fixture(autouse=True)
def tfcluster_home(module_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """This module's own state folder replaces the per-test one of conftest."""
    for key, value in module_env.items():
        monkeypatch.setenv(key, value)
    return Path(module_env["TFCLUSTER_HOME"])


def _chief_done(line: str) -> bool:
    """The chief's last progress event, as `logs` shows it (a sentence, as
    infra/progress.describe makes it; `--raw` would show the JSON)."""
    return line.startswith("pc-1/chief-0 done: ")


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def detached(module_env: dict[str, str]) -> dict[str, object]:
    """`train --detach -- --seed 9`, followed by a real `logs --follow`
    process, which ends by itself when the job does."""
    code, out = run("train", "--detach", "--", "--seed", "9")
    assert code == 0, out
    assert "started; follow with `deploy.py logs --follow`" in out
    run_id = out.split("job ", 1)[1].split(":", 1)[0]
    follow = subprocess.Popen(
        [sys.executable, "deploy.py", "logs", "--follow"],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="300"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []

    def read() -> None:
        assert follow.stdout is not None
        for line in follow.stdout:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and follow.poll() is None:
        time.sleep(0.5)
    if follow.poll() is None:
        follow.kill()
    followed_code = follow.wait(timeout=30)
    reader.join(timeout=10)
    # The chief says "done" a moment before it exits (its results are
    # written after): the tests after this one start jobs of their own,
    # which a job still running would (rightly) refuse.
    cluster = Cluster(load_config(module_env["TFCLUSTER_CONFIG"]))
    while time.monotonic() < deadline and cluster.running_job() is not None:
        time.sleep(0.5)
    return {"run_id": run_id, "start_output": out, "followed": lines, "follow_code": followed_code}


def test_detach_returns_and_logs_follow_streams_every_task(detached: dict[str, object]) -> None:
    lines = detached["followed"]
    assert isinstance(lines, list)
    assert any(map(_chief_done, lines))
    assert {line.split(" ", 1)[0] for line in lines} >= {"pc-1/ps-0", "pc-2/worker-0", "pc-1/chief-0"}
    # The follow ended with the job, and said so (its ps: stopped then).
    assert detached["follow_code"] == 0, lines[-20:]
    assert lines[-1] == f"job {detached['run_id']} has ended (exit code 0): nothing more to follow"
    out = detached["start_output"]
    assert isinstance(out, str)
    assert "ps-0@pc-1" in out and "worker-0@pc-2" in out and "chief-0@pc-1" in out


def test_status_table_names_the_cluster_from_tfcluster_config(detached: dict[str, object]) -> None:
    code, out = run("status")
    assert code == 0, out
    assert "jobs (local)" in out  # the config $TFCLUSTER_CONFIG names
    for node, roles in (("pc-1", "ps,chief"), ("pc-2", "worker")):
        row = next(line for line in out.splitlines() if f" {node} " in line)
        # (the local provider's status is LOCAL: its nodes are folders here)
        assert "LOCAL" in row and roles in row and "127.0.0.1" in row
    assert f"last job: {detached['run_id']}" in out


def test_logs_shows_each_tasks_lines_and_one_node_on_request(detached: dict[str, object]) -> None:
    code, out = run("logs", "-n", "5")
    assert code == 0, out
    prefixes = {line.split(" ", 1)[0] for line in out.splitlines() if line}
    assert prefixes == {"pc-1/ps-0", "pc-1/chief-0", "pc-2/worker-0"}
    code, out = run("logs", "pc-2")
    assert code == 0 and out.strip()
    assert {line.split(" ", 1)[0] for line in out.splitlines() if line} == {"pc-2/worker-0"}


def test_fetch_brings_the_run_home_with_job_args_and_trainer_flags(
    detached: dict[str, object], tmp_path: Path
) -> None:
    dest = tmp_path / "home-runs"
    code, out = run("fetch", "--dest", str(dest))
    assert code == 0, out
    run_dir = dest / str(detached["run_id"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["mode"] == "async" and summary["workers"] == 1
    # job.args gave --seed 7 and --steps-per-call 5; `-- --seed 9` came
    # after them and won.
    assert summary["steps_per_call"] == 5 and summary["seed"] == 9
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps and steps[-1] == STEPS, steps
    # 30 steps of the CNN learn something: far above chance (0.1), which a
    # model that never updates would stay at.
    assert summary["test_accuracy"] >= 0.3, summary
    assert (run_dir / "checkpoints" / "checkpoint").is_file()


def test_a_failed_training_exits_with_the_chiefs_code(detached: dict[str, object]) -> None:
    """--resume given to the trainer itself in a fresh run folder: the chief
    stops with CheckpointError's code (5), and so does `train`."""
    code, out = run("train", "--mode", "single", "--", "--resume")
    assert code == 5, out
    assert "error: the chief exited with code 5" in out
    assert "no checkpoint in" in out  # its last lines come with it
    code, out = run("status")
    assert code == 0 and "(exit code 5)" in out


def test_forget_host_drops_only_that_nodes_pinned_key(tmp_path: Path) -> None:
    config = tmp_path / "ssh.yaml"
    config.write_text(yaml.safe_dump({
        "name": "hosts", "provider": "ssh", "nodes": ["pc-1", "pc-2"],
        "roles": {"ps": "pc-1", "chief": "pc-1", "worker": "pc-2"},
        "hosts": {"pc-1": "127.0.0.1:2201", "pc-2": "127.0.0.1:2202"},
        "ssh": {"connect_timeout": 0.5},
    }))  # fmt: skip
    known = Path(os.environ["TFCLUSTER_HOME"]) / "clusters" / "hosts" / "known_hosts"
    known.parent.mkdir(parents=True, exist_ok=True)
    key = paramiko.ECDSAKey.generate()
    entry = f"{key.get_name()} {key.get_base64()}"
    known.write_text(f"[127.0.0.1]:2201 {entry} pc-1\n[127.0.0.1]:2202 {entry} pc-2\n")
    code, out = run("--config", str(config), "forget-host", "pc-1")
    assert code == 0, out
    assert "forgot the host key of pc-1" in out
    assert known.read_text() == f"[127.0.0.1]:2202 {entry} pc-2\n"
    code, out = run("--config", str(config), "forget-host", "pc-9")
    assert code == 2 and "pc-9 is not a node of hosts (pc-1, pc-2)" in out
