"""Runs land in a bucket from real nodes: a job on the docker-compose
cluster whose chief's node uploads its run folder, with its own client and
the service-account key of storage.credentials copied to it (mode 0600),
to the fake Cloud Storage on this machine (reached at the compose
network's gateway, token endpoint included); then `down`; then `fetch`
brings the run home from the bucket, the nodes no longer holding it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker.conftest import REPO, ComposeCluster, cluster_root, config_file
from tests.fake_gcs.server import FakeGcs, service_account_key

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def fake_gcs(compose_cluster: ComposeCluster) -> Iterator[FakeGcs]:
    # The compose network's gateway is this machine, as the nodes see it.
    gateway = compose_cluster.internal["pc-1"].rsplit(".", 1)[0] + ".1"
    with FakeGcs(host=gateway) as server:
        server.create_bucket("tfc-runs")
        yield server


def test_a_job_uploads_from_the_chief_and_comes_home_after_down(
    compose_cluster: ComposeCluster,
    fake_gcs: FakeGcs,
    node_key: tuple[Path, str],
    mnist_dir: Path,
    tmp_path: Path,
) -> None:
    data = compose_cluster.config("buckete2e", node_key[0], nodes=["pc-1", "pc-2"])
    data["roles"] = {"ps": "pc-1", "chief": "pc-1", "worker": ["pc-2"]}
    data["setup"]["sync"] = [str(mnist_dir)]
    data["job"].update(data_dir=f"tfcluster/{mnist_dir.name}", steps=20, checkpoint_every=10)
    email = "writer@proj.iam.gserviceaccount.com"
    (tmp_path / "writer.json").write_text(json.dumps(service_account_key(fake_gcs, email)))
    data["storage"] = {"bucket": "gs://tfc-runs/e2e", "endpoint": fake_gcs.endpoint,
                       "credentials": "writer.json"}  # fmt: skip
    config = config_file(tmp_path, data)
    env = dict(os.environ, TFCLUSTER_HOME=str(tmp_path / "home"), COLUMNS="200")

    def deploy(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, str(REPO / "deploy.py"), "--config", str(config), *args],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    deploy("up")
    fake_gcs.fail(503, upload="multipart")  # one upload answered 503: sent again
    out = deploy("train")
    [run_id] = [p.name for p in (tmp_path / "runs" / "buckete2e").iterdir()]
    prefix = f"e2e/buckete2e/{run_id}/"
    assert f"in the bucket: gs://tfc-runs/{prefix}" in out
    names = fake_gcs.names("tfc-runs", prefix)
    for wanted in ("summary.json", "metrics.jsonl", "checkpoints/checkpoint", "tfcluster-run.json"):
        assert prefix + wanted in names, names
    assert fake_gcs.failures_left() == 0
    assert fake_gcs.accounts() == {email}  # this machine's check and the node's uploads
    root = cluster_root(config, tmp_path / "home")
    assert root.startswith("tfcluster/buckete2e-"), root
    mode = subprocess.run(
        ["docker", "exec", compose_cluster.container("pc-1"),
         "stat", "-c", "%a", f"/home/tfcluster/{root}/storage-key.json"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    assert mode == "600"

    deploy("down", "--yes")
    # The nodes no longer hold the run (as after a VM's deletion).
    subprocess.run(
        ["docker", "exec", "-u", "tfcluster", compose_cluster.container("pc-1"),
         "rm", "-rf", f"/home/tfcluster/{root}/runs/{run_id}"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    (tmp_path / "runs" / "buckete2e" / run_id / "summary.json").unlink()
    out = deploy("fetch", "--dest", str(tmp_path / "back"))
    assert f"fetched {run_id} from gs://tfc-runs/{prefix[:-1]}" in out
    summary = json.loads((tmp_path / "back" / run_id / "summary.json").read_text())
    assert summary["steps"] == 20
