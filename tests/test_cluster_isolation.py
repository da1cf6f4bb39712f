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
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from infra.cluster import Cluster
from infra.config import parse_config
from infra.keys import ensure_key_pair
from infra.setup import install_plan
from infra.setup_commands import MARKER, probe_command
from infra.setup_facts import parse_probe
from infra.state import ClusterState
from infra.transport import NodeLayout
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


def test_a_venv_of_the_same_install_on_the_login_is_copied(tmp_path: Path) -> None:
    """A cluster's own folder would mean a TensorFlow install per cluster
    (minutes, a download, the wheelhouse uploaded again) where the login
    has one already: the venv an older tfcluster made in the shared folder,
    the node image's baked one, another cluster's. The setup's probe copies
    one of the very install by hard links, and finds it installed."""
    home = tmp_path / "host"
    template = home / "tfcluster" / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(template)], check=True)
    plan = install_plan(parse_config({"name": "lab"}, source="lab.yaml", base_dir=tmp_path))
    (template / MARKER).write_text(plan.fingerprint + "\n")
    (template / ".tfcluster-user-requirements").write_text("digest\n")
    root = "tfcluster/lab-0123456789ab"
    layout = NodeLayout(root, f"{root}/code", f"{root}/venv/bin/python", "r", "l", "tfcluster")

    def probe(fingerprint: str) -> str:
        done = subprocess.run(
            ["bash", "-c", probe_command(layout, fingerprint)],
            cwd=home, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return done.stdout

    other = dataclasses.replace(plan, requirements=plan.requirements + "six==1.16.0\n")
    out = probe(other.fingerprint)  # another install: nothing to copy
    assert not parse_probe(out).installed and "venv copied" not in out
    assert not (home / root / "venv").exists()
    out = probe(plan.fingerprint)
    assert parse_probe(out).installed and "@tfcluster venv copied" in out
    copy = home / root / "venv"
    prefix = subprocess.run(
        [str(copy / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert prefix == str(copy)  # a venv of its own, not the template
    assert (copy / "pyvenv.cfg").stat().st_ino == (template / "pyvenv.cfg").stat().st_ino
    # The markers are the copy's own files.
    assert (copy / MARKER).stat().st_ino != (template / MARKER).stat().st_ino
    assert not (copy / ".tfcluster-user-requirements").exists()
    assert (template / ".tfcluster-user-requirements").read_text() == "digest\n"
    assert (template / MARKER).read_text() == (copy / MARKER).read_text()


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
