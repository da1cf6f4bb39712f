"""deploy.py with provider gce, against the fake Compute API.

The whole stack runs: click, Cluster, lifecycle plans, GceProvider, the real
google-cloud-compute client, HTTP, and the fake's operations. ``--skip-setup``
everywhere: the fake's instances have no sshd (tests/docker covers setup).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko
import pytest
from click.testing import CliRunner

from deploy import cli
from tests.fake_gce import Call, FakeGce
from tests.fake_gce.sshd import LoopbackBackend, LoopbackSshd, key_line

pytest_plugins = ["tests.fake_gce.fixtures"]

NODES = ["pc-1", "pc-2", "pc-3", "pc-4"]
ZONE_A, ZONE_B = "us-central1-a", "us-central1-b"
DLVM = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11"

MakeYaml = Callable[..., Path]


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rich wraps log lines at the terminal width (80 under CliRunner); the
    # assertions read whole messages.
    monkeypatch.setenv("COLUMNS", "400")


@pytest.fixture
def config(gce_cluster_yaml: MakeYaml) -> Path:
    return gce_cluster_yaml()


def run(config: Path, *args: str, input: str | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, ["--config", str(config), *args], input=input, catch_exceptions=False
    )
    return result.exit_code, result.output


def status(config: Path) -> dict[str, dict[str, Any]]:
    code, out = run(config, "status", "--json")
    assert code == 0, out
    return {n["name"]: n for n in json.loads(out)}


def zone_of(instance: dict[str, Any]) -> str:
    return str(instance["zone"]).rsplit("/", 1)[1]


def error_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("error:")]


def test_up_creates_everything_and_a_second_up_changes_nothing(
    fake_gce: FakeGce, config: Path
) -> None:
    code, out = run(config, "up", "--skip-setup")
    assert code == 0, out
    assert "tfc-test is up: 4 nodes running" in out
    assert {i["name"]: i["status"] for i in fake_gce.instances()} == dict.fromkeys(
        NODES, "RUNNING"
    )
    assert sorted(f["name"] for f in fake_gce.firewalls()) == [
        "tfcluster-tfc-test-grpc", "tfcluster-tfc-test-grpc-deny", "tfcluster-tfc-test-ssh",
        "tfcluster-tfc-test-ssh-deny",
    ]
    nodes = status(config)
    assert [(n["state"], n["zone"]) for n in nodes.values()] == [("running", ZONE_A)] * 4
    assert nodes["pc-1"]["roles"] == ["ps", "chief"] and nodes["pc-4"]["roles"] == ["worker"]
    assert all(n["external_ip"].startswith("203.0.113.") for n in nodes.values())
    assert all(n["hourly_usd"] > 0.067 for n in nodes.values())

    fake_gce.reset_calls()
    code, out = run(config, "up", "--skip-setup")
    assert code == 0, out
    assert "all 4 nodes already up; nothing to do" in out
    assert fake_gce.mutating_calls() == []


def test_dry_runs_change_nothing(fake_gce: FakeGce, config: Path) -> None:
    code, out = run(config, "up", "--dry-run")
    assert code == 0, out
    for name in NODES:
        assert f"create  {name}" in out
    assert "ensure  firewall rule tfcluster-tfc-test-grpc\n" in out
    assert "ensure  firewall rule tfcluster-tfc-test-grpc-deny" in out
    assert "ensure  firewall rule tfcluster-tfc-test-ssh (SSH from 198.51.100.7/32)\n" in out
    assert fake_gce.mutating_calls() == [] and fake_gce.instances() == []

    run(config, "up", "--skip-setup")
    fake_gce.reset_calls()
    code, out = run(config, "down", "--dry-run")
    assert code == 0, out
    assert "delete  pc-1" in out and "delete  firewall rule tfcluster-tfc-test-ssh" in out
    code, out = run(config, "down", input="n\n")  # asked, and said no
    assert code == 1
    assert fake_gce.mutating_calls() == []
    assert len(fake_gce.instances()) == 4


def test_ssh_open_to_the_world_is_in_the_plan_and_warned_about(
    fake_gce: FakeGce, gce_cluster_yaml: MakeYaml
) -> None:
    config = gce_cluster_yaml(gce={"ssh_source_ranges": ["0.0.0.0/0"]})
    code, out = run(config, "up", "--dry-run")
    assert code == 0, out
    assert (
        "ensure  firewall rule tfcluster-tfc-test-ssh (SSH from 0.0.0.0/0): "
        "open to the whole internet"
    ) in out
    code, out = run(config, "up", "--skip-setup")
    assert code == 0, out
    warnings = [line for line in out.splitlines() if "open to the whole internet" in line]
    assert len(warnings) == 1 and "gce.ssh_source_ranges: 0.0.0.0/0" in warnings[0], out
    code, out = run(config, "down", "--yes")
    assert code == 0, out
    assert fake_gce.firewalls() == [] and fake_gce.instances() == []


def test_up_refuses_a_node_whose_host_key_is_not_the_published_one(
    fake_gce: FakeGce, gce_cluster_yaml: MakeYaml
) -> None:
    published, impostor = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()
    fake_gce.backend = LoopbackBackend([key_line(published)])
    with LoopbackSshd(impostor) as sshd:
        config = gce_cluster_yaml(ssh={"port": sshd.port, "boot_timeout": 10})
        code, out = run(config, "up")
    assert code == 8, out
    errors = error_lines(out)
    assert len(errors) == 1 and "is not the one pinned" in errors[0], out
    assert impostor.fingerprint in errors[0]
    code, out = run(config, "down", "--yes")
    assert code == 0, out


def test_stop_start_and_down(fake_gce: FakeGce, config: Path) -> None:
    run(config, "up", "--skip-setup")
    before = status(config)
    code, out = run(config, "stop")
    assert code == 0, out
    assert "stopped pc-1, pc-2, pc-3, pc-4" in out
    stopped = status(config)
    assert {n["status"] for n in stopped.values()} == {"TERMINATED"}
    assert all(n["external_ip"] is None for n in stopped.values())
    # A stopped node still pays for its disk.
    assert all(0 < n["hourly_usd"] < 0.01 for n in stopped.values())
    fake_gce.reset_calls()
    code, out = run(config, "stop")
    assert code == 0 and "nothing running" in out
    assert fake_gce.mutating_calls() == []

    code, out = run(config, "start")
    assert code == 0, out
    after = status(config)
    for name in NODES:
        assert after[name]["state"] == "running"
        assert after[name]["internal_ip"] == before[name]["internal_ip"]
        assert after[name]["external_ip"] not in (None, before[name]["external_ip"])

    code, out = run(config, "down", "--yes")
    assert code == 0, out
    assert "deleted tfc-test" in out
    fake_gce.wait_quiet()
    assert fake_gce.instances() == [] and fake_gce.firewalls() == []
    assert all(n["state"] == "absent" for n in status(config).values())


def test_up_after_stop_starts_the_nodes_instead_of_creating_them(
    fake_gce: FakeGce, config: Path
) -> None:
    run(config, "up", "--skip-setup")
    run(config, "stop")
    fake_gce.reset_calls()
    code, out = run(config, "up", "--skip-setup")
    assert code == 0, out
    assert "start   pc-1" in out
    ops = sorted(c.op for c in fake_gce.mutating_calls())
    assert ops == ["instances.start"] * 4
    assert {n["state"] for n in status(config).values()} == {"running"}


def test_a_preempted_spot_node_is_started_by_up(
    fake_gce: FakeGce, gce_cluster_yaml: MakeYaml
) -> None:
    config = gce_cluster_yaml(gce={"preemptible": True})
    run(config, "up", "--skip-setup")
    fake_gce.preempt("pc-2")
    assert status(config)["pc-2"]["state"] == "stopped"
    assert status(config)["pc-2"]["preemptible"] is True
    fake_gce.reset_calls()
    code, out = run(config, "up", "--skip-setup")
    assert code == 0, out
    assert [(c.op, c.name) for c in fake_gce.mutating_calls()] == [("instances.start", "pc-2")]


def test_a_node_deleted_by_hand_is_recreated(fake_gce: FakeGce, config: Path) -> None:
    run(config, "up", "--skip-setup")
    fake_gce.remove_instance("pc-2")
    assert status(config)["pc-2"]["state"] == "absent"
    fake_gce.reset_calls()
    code, out = run(config, "up", "--skip-setup")
    assert code == 0, out
    assert "create  pc-2" in out
    assert [(c.op, c.name) for c in fake_gce.mutating_calls()] == [("instances.insert", "pc-2")]
    assert status(config)["pc-2"]["state"] == "running"


def test_up_fails_over_to_the_next_zone(fake_gce: FakeGce, config: Path) -> None:
    fake_gce.stockout(ZONE_A, after=1, leave_instance=True)
    code, out = run(config, "up", "--skip-setup")
    assert code == 0, out
    warning = next(line for line in out.splitlines() if "trying zone" in line)
    assert "zone us-central1-a: ZONE_RESOURCE_POOL_EXHAUSTED: The zone" in warning
    assert warning.rstrip().endswith("; trying zone us-central1-b")
    assert [zone_of(i) for i in fake_gce.instances()] == [ZONE_B] * 4
    assert {n["zone"] for n in status(config).values()} == {ZONE_B}


def test_no_capacity_in_any_zone_exits_5_with_one_line(
    fake_gce: FakeGce, config: Path
) -> None:
    fake_gce.stockout(ZONE_A)
    fake_gce.stockout(ZONE_B, code="ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")
    code, out = run(config, "up", "--skip-setup")
    assert code == 5, out
    (line,) = error_lines(out)
    assert line.startswith("error: no zone could create pc-1, pc-2, pc-3, pc-4: ")
    assert f"{ZONE_A}: ZONE_RESOURCE_POOL_EXHAUSTED: " in line
    assert f"{ZONE_B}: ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS: " in line
    assert "Traceback" not in out
    assert fake_gce.instances() == []
    # The firewall rules stay until `down`, which removes them.
    code, out = run(config, "down", "--yes")
    assert code == 0, out
    fake_gce.wait_quiet()
    assert fake_gce.firewalls() == []


def _interrupt_on(fake: FakeGce, node: str) -> None:
    """Ctrl-C, as a terminal sends it, while ``up`` creates ``node``."""

    def interrupt(call: Call) -> None:
        os.kill(os.getpid(), signal.SIGINT)

    fake.latency.provision = 2.0  # the creates are still under way when it lands
    fake.hook("instances.insert", interrupt, name=node)


def test_ctrl_c_mid_up_then_down_leaves_nothing(fake_gce: FakeGce, config: Path) -> None:
    _interrupt_on(fake_gce, "pc-3")
    code, out = run(config, "up", "--skip-setup")
    assert code == 130, out
    assert error_lines(out) == ["error: interrupted"]
    fake_gce.wait_idle()  # every request the interrupted run sent is in or out
    assert fake_gce.instances(), "the interrupt came too early to test anything"
    fake_gce.latency.provision = 0.05
    code, out = run(config, "down", "--yes")
    assert code == 0, out
    fake_gce.wait_quiet()
    assert fake_gce.instances() == []
    assert fake_gce.firewalls() == []


def test_ctrl_c_mid_up_then_up_finishes_the_cluster(fake_gce: FakeGce, config: Path) -> None:
    _interrupt_on(fake_gce, "pc-2")
    code, _ = run(config, "up", "--skip-setup")
    assert code == 130
    fake_gce.wait_idle()
    fake_gce.latency.provision = 0.05
    code, out = run(config, "up", "--skip-setup")
    assert code == 0, out
    assert sorted(i["name"] for i in fake_gce.instances()) == NODES  # none twice
    assert {n["state"] for n in status(config).values()} == {"running"}


@pytest.mark.parametrize(
    ("overrides", "exit_code", "says"),
    [
        ({"gce": {"zonse": [ZONE_A]}}, 2, "gce.zonse: unknown key; did you mean 'zones'?"),
        ({"gce": {"zones": ["us-central1"]}}, 2, "is not a zone name"),
        ({"gce": {"labels": {"Team": "ml"}}}, 2, "'Team' is not a valid GCE label key"),
        ({"gce": {"credentials": "/nonexistent/key.json"}}, 6, "/nonexistent/key.json does not "
         "exist"),
        ({"gce": {"project": None}}, 6, "no Google Cloud project: set gce.project"),
        ({"gce": {"api_endpoint": "http://127.0.0.1:9"}}, 4, "cannot reach the Compute API"),
    ],
)
def test_bad_configs_are_one_line_with_their_exit_code(
    fake_gce: FakeGce,
    gce_cluster_yaml: MakeYaml,
    monkeypatch: pytest.MonkeyPatch,
    overrides: dict[str, Any],
    exit_code: int,
    says: str,
) -> None:
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    config = gce_cluster_yaml(**overrides)
    code, out = run(config, "up", "--skip-setup")
    assert code == exit_code, out
    (line,) = error_lines(out)
    assert says in line
    assert "Traceback" not in out and "unexpected failure" not in out
    assert fake_gce.mutating_calls() == []



@pytest.mark.parametrize(
    "gce",
    [
        {"zones": ["us-central1"]},  # the file's schema (infra/config/loader.py)
        {"labels": {"Team": "ml"}},  # the provider's own checks, once the file has loaded
        {"image": "debian-12"},
        {"accelerator": {"type": "nvidia-tesla-t4"}, "image": DLVM},
        {"image": "projects/debian-cloud/global/images/family/debian-99"},  # read from the API
        {"network": "no-such-network"},
    ],
    ids=["schema", "labels", "image path", "accelerator", "no image", "no network"],
)
def test_every_config_error_names_the_file_first(
    fake_gce: FakeGce, gce_cluster_yaml: MakeYaml, gce: dict[str, Any]
) -> None:
    """The gce provider's checks of cluster.yaml (labels, image, GPUs, the
    network) said "error: gce.image: ..." where every other mistake in the
    file says "error: cluster.yaml: gce.zones: ...": which file, then which key."""
    config = gce_cluster_yaml(gce=gce)
    for args in (["up", "--dry-run"], ["up", "--skip-setup"]):
        code, out = run(config, *args)
        assert code == 2, out
        (line,) = error_lines(out)
        assert line.startswith(f"error: {config}: gce."), line
    assert fake_gce.mutating_calls() == []
