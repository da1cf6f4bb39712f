"""`deploy.py sweep` on the compose cluster: four trials across the four
nodes (real sshd containers, the working folder synced, each trial's run
folder fetched home over SSH), then `report` on the sweep folder. After the
test no trial process is left on any node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker.conftest import REPO, ComposeCluster, config_file

pytestmark = pytest.mark.docker

NODES = ["pc-1", "pc-2", "pc-3", "pc-4"]


@pytest.fixture(scope="module")
def cluster_yaml(
    compose_cluster: ComposeCluster,
    node_key: tuple[Path, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """examples/compose.yaml on this run's ports, no data sync."""
    data = compose_cluster.config("sweeptest", node_key[0])
    return config_file(tmp_path_factory.mktemp("sweep-config"), data)


@pytest.fixture
def no_trial_left(compose_cluster: ComposeCluster) -> Iterator[None]:
    yield
    containers = {node: compose_cluster.container(node) for node in NODES}
    deadline = time.monotonic() + 10
    while True:
        left = {}
        for node, container in containers.items():
            done = subprocess.run(
                ["docker", "exec", container, "pgrep", "-af", "trial[.]py"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert done.returncode in (0, 1), f"pgrep on {node} failed: {done.stderr}"
            if done.returncode == 0:
                left[node] = done.stdout.strip()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not left, f"trial processes left on the nodes: {left}"


def test_four_trials_across_four_nodes(
    cluster_yaml: Path, tmp_path: Path, no_trial_left: None
) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "trial.py").write_text((REPO / "tests" / "programs" / "trial.py").read_text())
    home = tmp_path / "home"
    home.mkdir()
    dest = tmp_path / "results"
    env = dict(os.environ, TFCLUSTER_HOME=str(home), COLUMNS="200")
    done = subprocess.run(
        [sys.executable, str(REPO / "deploy.py"), "--config", str(cluster_yaml), "sweep",
         "--param", "lr=0.1,0.2,0.3,0.4", "--env", "TRIAL_SLEEP=5", "--workdir", str(workdir),
         "--dest", str(dest), "--", "python", "trial.py", "--lr", "{lr}"],
        cwd=home, env=env, capture_output=True, text=True, timeout=600,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    (folder,) = list(dest.iterdir())
    data = json.loads((folder / "sweep.json").read_text())
    trials = data["trials"]
    assert [t["state"] for t in trials] == ["done"] * 4
    # One trial per node: each went to the least busy node.
    assert sorted(t["node"] for t in trials) == NODES
    records = [json.loads((folder / t["name"] / "trial.json").read_text()) for t in trials]
    for trial, record in zip(trials, records, strict=True):
        assert record["argv"] == ["--lr", trial["params"]["lr"]]
        assert record["env"]["LR"] == trial["params"]["lr"]
        assert record["tf_config"] is None
        assert record["cwd"].endswith("/work")  # the synced working folder
        assert "/tfcluster/" in record["cwd"]  # in the cluster's own folder there
    # All four ran at once (four nodes, one slot each); the times are each
    # container's clock, which is this machine's.
    spans = [(r["started"], r["ended"]) for r in records]
    assert max(sum(s <= start < e for s, e in spans) for start, _ in spans) == 4
    report = subprocess.run(
        [sys.executable, str(REPO / "deploy.py"), "report", str(folder), "--json"],
        cwd=home, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)
    assert [r["best"] for r in rows] == [False, False, False, True]  # score = 10 x lr
