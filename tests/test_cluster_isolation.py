"""Two clusters on one SSH login never touch each other's jobs or files.

Alice and Bob both keep the shipped cluster name and log in to the same
host as the same user (a lab machine): a real SSH server (the paramiko
node of tests/hostile_node.py, which runs the commands with real bash in
its home folder here). Before, both used ``tfcluster/`` on the host, found
tasks by their names (chief-0) there, and so the second one's job was
refused, or one's `cancel` and `down` stopped the other's job, and one's
sync deleted the other's working folder. Each cluster now has a folder of
its own on the host (``tfcluster/<name>-<id>``, its id made once in its
state); a folder left by an older tfcluster (``tfcluster/`` itself) is
left as it is.
"""

from __future__ import annotations

import dataclasses
import fcntl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from infra.cluster.api import Cluster
from infra.config.loader import parse_config
from infra.setup.commands import MARKER, install_command
from infra.setup.nodes import install_plan
from infra.state.folder import ClusterState
from infra.state.keys import ensure_key_pair
from tests.hostile_node import FakeNode, fake_node
from tests.procs import none_left_in, processes_in


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[FakeNode, Path]]:
    """The shared host (its home folder here) and the login's key."""
    key = tmp_path / "login" / "id_ed25519"
    ensure_key_pair(key, "lab")
    home = tmp_path / "host"
    home.mkdir()
    with fake_node(paramiko.PKey.from_path(key), home=home, writable=True) as node:
        yield node, key
    none_left_in(home)


def sleeping(home: Path) -> int:
    """How many of the jobs' programs run on the host."""
    return sum(
        Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == b"sleep"
        for pid in processes_in(home)
    )


def lab(node: FakeNode, key: Path, tmp_path: Path, who: str) -> Cluster:
    """``who``'s cluster "lab" on the shared host, with a state of its own."""
    work = tmp_path / who / "project"
    work.mkdir(parents=True)
    (work / "train.py").write_text(f"print('{who}')\n")
    config = parse_config(
        {
            "name": "lab",
            "provider": "ssh",
            "nodes": ["pc-1"],
            "roles": {"ps": [], "chief": "pc-1", "worker": []},
            "job": {"mode": "single", "workdir": str(work)},
            "hosts": {"pc-1": f"127.0.0.1:{node.port}"},
            "ssh": {"key_file": str(key), "connect_timeout": 5},
        },
        source=f"{who}.yaml",
        base_dir=work,
    )
    return Cluster(config, ClusterState("lab", home=tmp_path / who / ".tfcluster"))


def test_two_clusters_on_one_login_keep_to_their_own(
    host: tuple[FakeNode, Path], tmp_path: Path
) -> None:
    node, key = host
    home = node.home
    assert home is not None
    alice, bob = lab(node, key, tmp_path, "alice"), lab(node, key, tmp_path, "bob")
    # A folder of an older tfcluster on the same login: left alone.
    (home / "tfcluster" / "runs" / "old-run").mkdir(parents=True)
    (home / "tfcluster" / "runs" / "old-run" / "summary.json").write_text("{}")

    a = alice.run_program(["sleep", "300"], detach=True)
    b = bob.run_program(["sleep", "300"], detach=True)
    assert alice.running_job() is not None and bob.running_job() is not None
    ours = {c: home / "tfcluster" / f"lab-{c.state.cluster_id()}" for c in (alice, bob)}
    assert ours[alice] != ours[bob]
    for cluster, who in ((alice, "alice"), (bob, "bob")):
        assert (ours[cluster] / "work" / "train.py").read_text() == f"print('{who}')\n"
        assert (ours[cluster] / "logs" / "chief-0.pid").is_file()
    assert sleeping(home) == 2

    # Alice's cancel, her next sync and her `down` leave Bob's job and files.
    record, stopped = alice.cancel()
    assert record.run_id == a.spec.run_id and stopped
    assert alice.running_job() is None
    running = bob.running_job()
    assert running is not None and running.run_id == b.spec.run_id
    alice.exec(["true"], None, workdir=alice.workdir(), on_line=lambda n, line: None)
    alice.down(alice.plan_down())
    running = bob.running_job()
    assert running is not None and running.run_id == b.spec.run_id
    assert (ours[bob] / "work" / "train.py").read_text() == "print('bob')\n"
    assert sleeping(home) == 1
    bob.cancel()
    assert bob.running_job() is None
    assert (home / "tfcluster" / "runs" / "old-run" / "summary.json").read_text() == "{}"


def test_two_local_clusters_of_one_name_keep_to_their_own(tmp_path: Path) -> None:
    """The local provider's nodes are folders of the cluster's state: two
    people's clusters of one name on one machine are apart already."""
    clusters = []
    for who in ("alice", "bob"):
        work = tmp_path / who / "project"
        work.mkdir(parents=True)
        config = parse_config(
            {"name": "lab", "provider": "local", "nodes": ["pc-1"],
             "roles": {"ps": [], "chief": "pc-1", "worker": []},
             "job": {"mode": "single", "workdir": str(work)}},
            source=f"{who}.yaml", base_dir=work,
        )  # fmt: skip
        clusters.append(Cluster(config, ClusterState("lab", home=tmp_path / who / ".tfcluster")))
    alice, bob = clusters
    try:
        alice.run_program(["sleep", "300"], detach=True)
        b = bob.run_program(["sleep", "300"], detach=True)
        alice.cancel()
        alice.down(alice.plan_down())
        running = bob.running_job()
        assert running is not None and running.run_id == b.spec.run_id
        assert sleeping(tmp_path / "bob") == 1 and sleeping(tmp_path / "alice") == 0
    finally:
        bob.cancel()
        for who in ("alice", "bob"):
            none_left_in(tmp_path / who)


def test_one_login_shares_one_node_environment_one_install_at_a_time(tmp_path: Path) -> None:
    """The venv is the login's (a TensorFlow install per cluster would cost
    minutes and gigabytes, and a node image's baked one would go unused):
    the clusters there share it. Two `up`s at once install one after the
    other (a lock on the node), and an install another cluster shares is
    not replaced by a different one (exit 22, one line)."""
    config = parse_config(
        {"name": "lab", "provider": "ssh", "nodes": ["pc-1"], "hosts": {"pc-1": "127.0.0.1:2201"},
         "roles": {"ps": [], "chief": "pc-1", "worker": []}, "job": {"mode": "single"}},
        source="lab.yaml", base_dir=tmp_path,
    )  # fmt: skip
    layouts = []
    for who in ("alice", "bob"):
        provider = Cluster(config, ClusterState("lab", home=tmp_path / who)).provider
        layouts.append(provider.transport(provider.non_terminated_nodes()).layout("pc-1"))
    alice, bob = layouts
    assert alice.root != bob.root and alice.root.startswith("tfcluster/lab-")
    assert alice.python == bob.python == "tfcluster/venv/bin/python"
    home = tmp_path / "host"
    (home / "tfcluster" / "venv").mkdir(parents=True)
    marker = home / "tfcluster" / "venv" / MARKER
    marker.write_text("sha256:bobs-install\n")
    (home / bob.root).mkdir()
    # Python missing on purpose: what passes the guard and the lock ends there.
    plan = dataclasses.replace(install_plan(config), python="no-such-python")
    script = install_command(alice, plan, None)

    def install() -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["bash", "-c", script], cwd=home, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    refused = install()
    _, err = refused.communicate(timeout=30)
    assert refused.returncode == 22, err
    assert err == (
        f"tfcluster/venv holds another install, which the cluster in {bob.root} shares; "
        "give this cluster its own setup.remote_dir\n"
    )
    assert marker.read_text() == "sha256:bobs-install\n"  # untouched

    (home / bob.root).rmdir()  # no other cluster there: alice's to replace
    with open(home / "tfcluster" / ".tfcluster-env.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another install runs
        waiting = install()
        time.sleep(1.5)
        assert waiting.poll() is None  # waits for it
    _, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 20 and "no no-such-python on this node" in err, err
    assert not marker.exists()  # it went on once the lock was free


def test_a_data_dir_in_the_remote_dir_is_in_the_clusters_own_folder(tmp_path: Path) -> None:
    """setup.sync puts the data in the cluster's folder: job.data_dir
    ``tfcluster/mnist`` (examples/compose.yaml) follows it there."""
    def data_dir(provider: dict[str, object], data: str) -> str:
        config = parse_config(
            {"name": "lab", "nodes": ["pc-1"], "job": {"mode": "single", "data_dir": data},
             "roles": {"ps": [], "chief": "pc-1", "worker": []}, **provider},
            source="lab.yaml", base_dir=tmp_path,
        )  # fmt: skip
        cluster = Cluster(config, ClusterState("lab", home=tmp_path / "state"))
        argv = cluster.train_spec().program.argv
        return argv[argv.index("--data-dir") + 1]

    ssh: dict[str, object] = {"provider": "ssh", "hosts": {"pc-1": "127.0.0.1:2201"}}
    own = f"tfcluster/lab-{ClusterState('lab', home=tmp_path / 'state').cluster_id()}"
    assert data_dir(ssh, "tfcluster/mnist") == f"{own}/mnist"
    assert data_dir(ssh, "tfcluster") == own
    assert data_dir(ssh, "tfclusterx/mnist") == "tfclusterx/mnist"
    assert data_dir(ssh, "/data/mnist") == "/data/mnist"
    assert data_dir({"provider": "local"}, "tfcluster/mnist") == "tfcluster/mnist"
