"""Two people keep the shipped cluster name in one GCE project: each
cluster is its own by the id in its state (``tfcluster-id``, a label on
its instances, a mark in its firewall rules' descriptions), against the
fake Compute API through deploy.py and the real client.

Before, Bob's `up` adopted Alice's nodes (they carry the name's label),
replaced their ``ssh-keys`` with his key, rewrote her firewall rules, and
his `down` would have deleted them. Now his `up` is refused in one line
(exit 3), and nothing of hers is touched by any of his commands. Nodes and
rules made before the id existed (no label, no mark) are taken as the
cluster's by the first `up` and labelled; from then on they are its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from deploy import cli
from infra.config.loader import load_config
from infra.providers.gce import GceProvider
from infra.providers.gce._google import compute_v1
from infra.providers.gce.api import _last
from infra.state.folder import ClusterState
from tests.fake_gce import FakeGce

pytest_plugins = ["tests.fake_gce.fixtures"]

NODES = ["pc-1", "pc-2"]
ID_LABEL = "tfcluster-id"  # the label that makes a node a state's own


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")


def deploy(home: Path, config: Path, *args: str) -> tuple[int, str]:
    """deploy.py as the person whose ~/.tfcluster is ``home``."""
    result = CliRunner(env={"TFCLUSTER_HOME": str(home)}).invoke(
        cli, ["--config", str(config), *args], catch_exceptions=False
    )
    return result.exit_code, result.output


def owned(fake: FakeGce) -> dict[str, Any]:
    """What one cluster holds in the project, as the API shows it."""
    return {
        "instances": {
            i["name"]: (i["labels"], i["metadata"], i["status"]) for i in fake.instances()
        },
        "firewalls": {f["name"]: f for f in fake.firewalls()},
    }


def test_a_second_state_of_the_same_name_is_refused_and_changes_nothing(
    fake_gce: FakeGce, gce_cluster_yaml: Any, tmp_path: Path
) -> None:
    config = gce_cluster_yaml(nodes=NODES, roles={"ps": "pc-1", "chief": "pc-1", "worker": "pc-2"})
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    code, out = deploy(alice, config, "up", "--skip-setup")
    assert code == 0, out
    before = owned(fake_gce)
    alice_id = ClusterState("tfc-test", home=alice).cluster_id()
    assert {labels[ID_LABEL] for labels, _, _ in before["instances"].values()} == {alice_id}
    assert all(f"[tfcluster-id={alice_id}]" in f["description"] for f in before["firewalls"].values())
    fake_gce.reset_calls()

    for args in (["up", "--skip-setup"], ["up", "--dry-run"]):
        code, out = deploy(bob, config, *args)
        assert code == 3, out
        (line,) = [ln for ln in out.splitlines() if ln.startswith("error:")]
        assert "pc-1, pc-2, tfcluster-tfc-test-grpc" in line and alice_id in line
        assert line.endswith(f"rename this cluster (name: in {config})")
    # His other commands do not see her nodes, and his `down` leaves them.
    code, out = deploy(bob, config, "status", "--json")
    assert code == 0 and '"status": "ABSENT"' in out and '"RUNNING"' not in out, out
    code, out = deploy(bob, config, "stop")
    assert code == 0, out
    code, out = deploy(bob, config, "down", "--yes")
    assert code == 0, out
    assert fake_gce.mutating_calls() == []
    assert owned(fake_gce) == before
    # Hers still are hers.
    code, out = deploy(alice, config, "up", "--skip-setup")
    assert code == 0 and "all 2 nodes already up; nothing to do" in out, out
    assert owned(fake_gce) == before


def test_nodes_made_before_the_id_are_adopted_by_the_first_up(
    fake_gce: FakeGce, gce_cluster_yaml: Any, tmp_path: Path
) -> None:
    config = gce_cluster_yaml(nodes=NODES, roles={"ps": "pc-1", "chief": "pc-1", "worker": "pc-2"})
    old, bob = tmp_path / "old", tmp_path / "bob"
    code, out = deploy(old, config, "up", "--skip-setup")
    assert code == 0, out
    as_before_the_id(fake_gce, config, old)

    # The state that made them, upgraded: its first `up` labels them.
    code, out = deploy(old, config, "up", "--skip-setup")
    assert code == 0, out
    assert "pc-1, pc-2 had no tfcluster-id label (made by an older tfcluster)" in out
    new_id = ClusterState("tfc-test", home=old).cluster_id()
    assert {i["labels"][ID_LABEL] for i in fake_gce.instances()} == {new_id}
    assert all(f"[tfcluster-id={new_id}]" in f["description"] for f in fake_gce.firewalls())
    # From then on they are its own: another state is refused.
    code, out = deploy(bob, config, "up", "--skip-setup")
    assert code == 3 and "belong to another tfcluster state" in out, out


def test_a_new_state_never_adopts_nodes_an_older_tfcluster_made(
    fake_gce: FakeGce, gce_cluster_yaml: Any, tmp_path: Path
) -> None:
    """Alice's nodes were made by a tfcluster without ids (no label, no
    mark). Bob, new, keeps the shipped name: his `up` took them as his,
    labelled them with his id and replaced their ssh-keys with his key
    (Alice locked out of her own nodes, and refused by them from then on).
    Now it is refused in one line before any change; his status, stop and
    down do not see them; Alice's own state still adopts them."""
    config = gce_cluster_yaml(nodes=NODES, roles={"ps": "pc-1", "chief": "pc-1", "worker": "pc-2"})
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    code, out = deploy(alice, config, "up", "--skip-setup")
    assert code == 0, out
    as_before_the_id(fake_gce, config, alice)
    before = owned(fake_gce)
    fake_gce.reset_calls()

    for args in (["up", "--skip-setup"], ["up", "--dry-run"]):
        code, out = deploy(bob, config, *args)
        assert code == 3, out
        (line,) = [ln for ln in out.splitlines() if ln.startswith("error:")]
        assert line.startswith("error: pc-1, pc-2, tfcluster-tfc-test-grpc, ") and alice.name not in line
        assert "of cluster tfc-test" in line and "made by an older tfcluster" in line
        assert "add-labels" in out
    for args in (["status", "--json"], ["stop"], ["down", "--yes"]):
        code, out = deploy(bob, config, *args)
        assert code == 0, out
    assert fake_gce.mutating_calls() == []
    assert owned(fake_gce) == before

    code, out = deploy(alice, config, "up", "--skip-setup")
    assert code == 0 and "had no tfcluster-id label" in out, out
    alice_id = ClusterState("tfc-test", home=alice).cluster_id()
    assert {i["labels"][ID_LABEL] for i in fake_gce.instances()} == {alice_id}


def as_before_the_id(fake: FakeGce, config: Path, home: Path) -> None:
    """The cluster as a tfcluster without ids left it: no id label, no
    mark in the rules, no id in the state."""
    state = ClusterState("tfc-test", home=home)
    provider = GceProvider(load_config(config), state)
    for inst in fake.instances():
        zone = _last(inst["zone"])
        labels = {k: v for k, v in inst["labels"].items() if k != ID_LABEL}
        op = provider._set_labels(zone, inst["name"], labels, inst["labelFingerprint"])
        provider._wait_operation(op, zone=zone, what="unlabel")
    for rule in fake.firewalls():
        body = compute_v1.Firewall(provider._get_firewall(rule["name"]))
        body.description = body.description.rsplit(" [", 1)[0]
        provider._wait_operation(provider._update_firewall(body), zone=None, what="unmark")
    state.modify(lambda data: data.pop("cluster_id"))
    assert all(ID_LABEL not in i["labels"] for i in fake.instances())
    assert all("tfcluster-id" not in f["description"] for f in fake.firewalls())
