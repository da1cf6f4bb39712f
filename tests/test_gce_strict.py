"""Issue 18: what real Compute Engine would refuse, refused before anything
is created (one line, exit 2), failed over, or made to work, against the
strict fake GCE (tests/fake_gce/catalog.py)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, cast

import pytest
from google.cloud import compute_v1

from infra.config.loader import ClusterConfig
from infra.errors import ConfigError
from infra.providers.base import NodeState
from infra.providers.gce import _STATES, GceProvider
from infra.providers.gce import checks as gce_checks
from infra.state.folder import ClusterState
from tests.fake_gce import FakeGce

pytest_plugins = ["tests.fake_gce.fixtures"]

DLVM = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11"
MakeProvider = Callable[..., GceProvider]


@pytest.fixture
def make_provider(gce_config: Callable[..., ClusterConfig]) -> MakeProvider:
    def make(**overrides: Any) -> GceProvider:
        config = gce_config(**overrides)
        return GceProvider(config, ClusterState(config.name))

    return make


def up(provider: GceProvider, names: list[str] | None = None) -> None:
    provider.prepare()
    provider.create_nodes(names or ["pc-1"])


def refused(make_provider: MakeProvider, fake: FakeGce, **gce: Any) -> str:
    """The ConfigError line for these gce settings; nothing was changed."""
    with pytest.raises(ConfigError) as caught:
        up(make_provider(gce=gce))
    assert fake.mutating_calls() == [] and fake.instances() == []
    assert caught.value.exit_code == 2
    message = str(caught.value)
    assert "\n" not in message
    return message


# -- GPUs and machine families ------------------------------------------------------------


def test_the_readme_gpu_example_on_the_default_machine_type_is_refused_first(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    # Real GCE: 400 after the firewall rules were made, `up` exit 4.
    message = refused(make_provider, fake_gce, accelerator={"type": "nvidia-tesla-t4"},
                      image=DLVM)
    assert "e2-standard-2 takes no GPU" in message and "n1" in message


def test_gpu_counts_and_types_name_the_valid_choices(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    message = refused(make_provider, fake_gce, machine_type="n1-standard-8", image=DLVM,
                      accelerator={"type": "nvidia-tesla-t4", "count": 3})
    assert "choose 1, 2, 4" in message
    message = refused(make_provider, fake_gce, machine_type="n1-standard-8", image=DLVM,
                      accelerator={"type": "nvidia-l4", "count": 1})
    assert "g2-standard" in message and "nvidia-tesla-t4" in message
    message = refused(make_provider, fake_gce, machine_type="g2-standard-4", image=DLVM,
                      accelerator={"type": "nvidia-l4", "count": 1})
    assert "built in" in message


def test_gpus_on_an_image_without_the_driver_are_refused(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    message = refused(make_provider, fake_gce, machine_type="n1-standard-4",
                      accelerator={"type": "nvidia-tesla-t4"})
    assert "no NVIDIA driver" in message and "deeplearning-platform-release" in message
    message = refused(make_provider, fake_gce, machine_type="g2-standard-4",
                      disk_type="pd-balanced")
    assert "no NVIDIA driver" in message


def test_disk_type_fits_the_machine_family(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    message = refused(make_provider, fake_gce, machine_type="g2-standard-4", image=DLVM,
                      disk_type="pd-standard")
    assert "choose pd-balanced, pd-ssd" in message
    message = refused(make_provider, fake_gce, machine_type="n4-standard-2")
    assert "choose hyperdisk-balanced" in message


def test_a_g2_node_fails_over_from_a_zone_without_g2(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    # us-central1-f (in the default zone list) has no G2: real GCE answers 400 `invalid`.
    provider = make_provider(gce={
        "zones": ["us-central1-f", "us-central1-a"], "machine_type": "g2-standard-4",
        "disk_type": "pd-balanced", "image": DLVM,
    })
    up(provider)
    (node,) = provider.non_terminated_nodes()
    assert node.zone == "us-central1-a" and node.accelerators == "1 x nvidia-l4"
    inst = fake_gce.instance("pc-1")
    assert inst["scheduling"]["onHostMaintenance"] == "TERMINATE"
    metadata = {i["key"]: i["value"] for i in inst["metadata"]["items"]}
    assert metadata["install-nvidia-driver"] == "True"
    assert inst["disks"][0]["diskSizeGb"] == "50"
    # The cost counts the 50 GB disk, also from a provider that did not create it.
    from infra.providers.gce.pricing import table as pricing

    again = make_provider(gce={
        "zones": ["us-central1-f", "us-central1-a"], "machine_type": "g2-standard-4",
        "disk_type": "pd-balanced", "image": DLVM,
    })
    (listed,) = again.non_terminated_nodes()
    expected = pricing.node_hourly(
        "g2-standard-4", running=True, accelerators=[("nvidia-l4", 1)], disk_gb=50,
        disk_type="pd-balanced", zone="us-central1-a",
    ).usd_per_hour
    assert again.hourly_cost([listed]) == pytest.approx(expected)


def test_a_spot_vm_preempted_while_created_fails_over(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    fake_gce.stockout("us-central1-a", code="UNSUPPORTED_OPERATION")
    provider = make_provider(gce={"preemptible": True})
    up(provider)
    assert [n.zone for n in provider.non_terminated_nodes()] == ["us-central1-b"]


# -- images and disks -------------------------------------------------------------------------


def test_a_disk_smaller_than_the_image_is_refused_naming_its_size(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    message = refused(make_provider, fake_gce, machine_type="n1-standard-4", image=DLVM,
                      accelerator={"type": "nvidia-tesla-t4"}, disk_gb=20)
    assert "20 GB is smaller than the image" in message and "(50 GB)" in message


def test_an_image_that_does_not_exist_is_refused(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    message = refused(make_provider, fake_gce,
                      image="projects/debian-cloud/global/images/family/debian-99")
    assert "gce.image" in message and "does not exist" in message
    with pytest.raises(ConfigError, match="not an image path"):
        make_provider(gce={"image": "debian-12"}).check_config()


def test_the_default_disk_is_20_gb_on_a_small_image(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    up(make_provider())
    assert fake_gce.instance("pc-1")["disks"][0]["diskSizeGb"] == "20"


# -- networks -----------------------------------------------------------------------------------


def test_a_custom_mode_network_without_subnetwork_is_refused_naming_them(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    fake_gce.add_network("vpc", {"us-central1": ["sub-a", "sub-b"], "europe-west1": ["sub-e"]})
    message = refused(make_provider, fake_gce, network="vpc")
    assert "custom-mode" in message and "sub-a (us-central1)" in message


def test_a_subnetwork_of_another_region_is_refused(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    fake_gce.add_network("vpc", {"us-central1": ["sub-a"], "europe-west1": ["sub-e"]})
    message = refused(make_provider, fake_gce, network="vpc",
                      subnetwork="regions/europe-west1/subnetworks/sub-e")
    assert "us-central1-a, us-central1-b" in message
    message = refused(make_provider, fake_gce, network="vpc", subnetwork="sub-e",
                      zones=["us-central1-a", "europe-west1-b"])
    assert "no subnetwork 'sub-e' in us-central1" in message


def test_a_custom_mode_network_with_its_subnetwork_works(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    fake_gce.add_network("vpc", {"us-central1": ["sub-a"]})
    up(make_provider(gce={"network": "vpc", "subnetwork": "sub-a"}))
    nic = fake_gce.instance("pc-1")["networkInterfaces"][0]
    assert nic["subnetwork"].endswith("/regions/us-central1/subnetworks/sub-a")


# -- the firewall on the default network ----------------------------------------------------


def test_ssh_and_grpc_reach_only_whom_the_config_says_despite_gces_defaults(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    # The fixture's ssh_source_ranges: 198.51.100.7/32. GCE's default-allow-ssh
    # (0.0.0.0/0, 65534) would let everyone else in without the deny rule.
    up(make_provider(), ["pc-1", "pc-2"])
    assert fake_gce.reachable("pc-1", 22, source_ip="198.51.100.7")
    assert not fake_gce.reachable("pc-1", 22, source_ip="192.0.2.50")
    assert fake_gce.reachable("pc-1", 2222, source="pc-2")
    # Another VM of the project, in default-allow-internal's 10.128.0.0/9.
    assert not fake_gce.reachable("pc-1", 2222, source_ip="10.128.9.9")
    deny = fake_gce.firewall("tfcluster-tfc-test-ssh-deny")
    assert deny is not None and 1000 < deny["priority"] < 65534
    assert deny["denied"] == [{"IPProtocol": "tcp", "ports": ["22"]}]


def test_ssh_open_to_all_has_no_deny_rule_and_drops_an_old_one(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    up(make_provider())
    assert fake_gce.firewall("tfcluster-tfc-test-ssh-deny") is not None
    up(make_provider(gce={"ssh_source_ranges": ["0.0.0.0/0"]}))
    assert fake_gce.firewall("tfcluster-tfc-test-ssh-deny") is None
    assert fake_gce.reachable("pc-1", 22, source_ip="192.0.2.50")


# -- metadata and OS Login -------------------------------------------------------------------


def test_extra_metadata_reaches_the_nodes_but_not_over_tfclusters_keys(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    up(make_provider(gce={"metadata": {"startup-script": "echo hi"}}))
    items = {i["key"]: i["value"] for i in fake_gce.instance("pc-1")["metadata"]["items"]}
    assert items["startup-script"] == "echo hi" and items["enable-oslogin"] == "FALSE"
    for key in ("ssh-keys", "enable-oslogin"):
        with pytest.raises(ConfigError, match=f"gce.metadata: {key} is set by tfcluster"):
            make_provider(gce={"metadata": {key: "TRUE"}}).check_config()
    with pytest.raises(ConfigError, match="not a metadata key"):
        make_provider(gce={"metadata": {"bad key;rm": "x"}}).check_config()


def test_os_login_enforced_on_the_project_is_said_with_what_to_do(
    fake_gce: FakeGce, make_provider: MakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    provider = make_provider()
    assert "organisation policy" in (provider._auth_hint() or "")
    fake_gce.project_metadata["fake-project"] = {"enable-oslogin": "TRUE"}
    provider.prepare()
    assert "enforces OS Login" in caplog.text
    hint = provider._auth_hint() or ""
    assert "enable-oslogin=FALSE" in hint and "gcloud compute project-info" in hint


# -- statuses ---------------------------------------------------------------------------------


def test_every_instance_status_is_mapped() -> None:
    # An IntEnum (proto-plus's Enum), which mypy cannot see: proto-plus is untyped.
    status = cast(type[enum.IntEnum], compute_v1.Instance.Status)
    statuses = {s.name for s in status if s.name != "UNDEFINED_STATUS"}
    assert statuses <= set(_STATES), statuses - set(_STATES)
    assert _STATES["PENDING_STOP"] is NodeState.STOPPING
    assert _STATES["STOPPED"] is NodeState.STOPPED


def test_a_pending_stop_node_is_waited_for_then_started(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    provider = make_provider()
    up(provider)
    fake_gce.latency.stop = 0.3
    fake_gce.pending_stop("pc-1")
    provider.start_nodes(["pc-1"])
    assert fake_gce.instance("pc-1")["status"] == "RUNNING"
    starts = [c for c in fake_gce.calls if c.op == "instances.start"]
    assert [c.status for c in starts] == [200]


# -- the static tables --------------------------------------------------------------------------


def test_builtin_gpus_follow_the_machine_type_name() -> None:
    assert gce_checks.builtin_gpus("g2-standard-48") == ("nvidia-l4", 4)
    assert gce_checks.builtin_gpus("a2-highgpu-2g") == ("nvidia-tesla-a100", 2)
    assert gce_checks.builtin_gpus("a2-ultragpu-1g") == ("nvidia-a100-80gb", 1)
    assert gce_checks.builtin_gpus("a3-highgpu-8g") == ("nvidia-h100-80gb", 8)
    assert gce_checks.builtin_gpus("n1-standard-4") is None


def test_an_ssh_refusal_on_an_os_login_project_says_so(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    import paramiko

    from infra.errors import RemoteError
    from tests.fake_gce.sshd import LoopbackBackend, LoopbackSshd

    fake_gce.backend = LoopbackBackend()
    fake_gce.project_metadata["fake-project"] = {"enable-oslogin": "TRUE"}
    # A VM under OS Login ignores the ssh-keys metadata: our login is refused.
    with LoopbackSshd(paramiko.ECDSAKey.generate(), user="someone-else") as sshd:
        provider = make_provider(ssh={"port": sshd.port, "connect_timeout": 5, "boot_timeout": 2})
        up(provider)
        with provider.transport(provider.non_terminated_nodes()) as transport, pytest.raises(
            RemoteError
        ) as caught:
            transport.wait_ready(timeout=1)
    assert "authentication failed" in str(caught.value)
    assert "enforces OS Login" in (caught.value.hint or "")


# -- the CLI ------------------------------------------------------------------------------------


def test_up_dry_run_refuses_the_readme_gpu_example_and_down_still_works(
    fake_gce: FakeGce, gce_cluster_yaml: Callable[..., Any], tfcluster_home: Any
) -> None:
    from click.testing import CliRunner

    from deploy import cli

    def run(path: Any, *args: str) -> tuple[int, str]:
        result = CliRunner().invoke(cli, ["--config", str(path), *args], input="y\n")
        return result.exit_code, result.output

    good = gce_cluster_yaml(nodes=["pc-1"], roles={"ps": [], "chief": "pc-1", "worker": []},
                            job={"mode": "single"})
    assert run(good, "up", "--skip-setup")[0] == 0
    bad = gce_cluster_yaml(
        nodes=["pc-1"], roles={"ps": [], "chief": "pc-1", "worker": []}, job={"mode": "single"},
        gce={"accelerator": {"type": "nvidia-tesla-t4", "count": 1}},
    )
    fake_gce.reset_calls()
    code, out = run(bad, "up", "--dry-run")
    assert code == 2 and "e2-standard-2 takes no GPU" in out
    assert len([line for line in out.splitlines() if line.strip()]) <= 2
    # What needs the API (the image's size) is checked by a dry run too.
    small = gce_cluster_yaml(
        nodes=["pc-1"], roles={"ps": [], "chief": "pc-1", "worker": []}, job={"mode": "single"},
        gce={"machine_type": "n1-standard-4", "disk_gb": 20, "image": DLVM,
             "accelerator": {"type": "nvidia-tesla-t4", "count": 1}},
    )
    code, out = run(small, "up", "--dry-run")
    assert code == 2 and "smaller than the image" in out
    assert fake_gce.mutating_calls() == []
    # A cluster.yaml that `up` refuses must still take the cluster down.
    bad = gce_cluster_yaml(
        nodes=["pc-1"], roles={"ps": [], "chief": "pc-1", "worker": []}, job={"mode": "single"},
        gce={"accelerator": {"type": "nvidia-tesla-t4", "count": 1}},
    )
    code, out = run(bad, "status")
    assert code == 0, out
    code, out = run(bad, "down", "--yes")
    assert code == 0, out
    assert fake_gce.instances() == [] and fake_gce.firewalls() == []


def test_a_shared_vpc_gets_its_firewall_rules_in_the_host_project(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    fake_gce.add_network("shared", {"us-central1": ["sub-s"]}, project="host-project")
    provider = make_provider(gce={
        "network": "projects/host-project/global/networks/shared",
        "subnetwork": "projects/host-project/regions/us-central1/subnetworks/sub-s",
    })
    up(provider)
    inserts = [c for c in fake_gce.calls if c.op == "firewalls.insert"]
    assert {c.project for c in inserts} == {"host-project"} and len(inserts) == 4
    nic = fake_gce.instance("pc-1")["networkInterfaces"][0]
    assert nic["network"].endswith("/projects/host-project/global/networks/shared")
    assert fake_gce.reachable("pc-1", 22, source_ip="198.51.100.7")
    provider.release()
    assert fake_gce.firewalls() == []


def test_the_gpu_example_passes_the_checks_and_comes_up_on_the_fake(
    fake_gce: FakeGce, fast_gce: None, tfcluster_home: Any
) -> None:
    from pathlib import Path

    from infra.config.loader import load_config
    from infra.providers.gce.config import gce_config

    example = load_config(Path(__file__).parents[1] / "examples" / "gce-gpu.yaml")
    gce = gce_config(example).model_copy(update={
        "project": "fake-project", "api_endpoint": fake_gce.endpoint,
        "credentials": "anonymous", "operation_timeout": 20.0,
    })
    config = example.model_copy(update={"gce": gce})
    provider = GceProvider(config, ClusterState(config.name))
    provider.check_config()
    up(provider, config.nodes)
    nodes = provider.non_terminated_nodes()
    assert [n.accelerators for n in nodes] == ["1 x nvidia-tesla-t4"] * 2
    assert {n.zone for n in nodes} == {"us-central1-a"}


def test_hostile_metadata_values_and_image_paths(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    # A metadata value is data for the API, never shell: it arrives verbatim.
    hostile = "$(reboot)\n`id`; rm -rf / #'\""
    up(make_provider(gce={"metadata": {"note": hostile}}))
    items = {i["key"]: i["value"] for i in fake_gce.instance("pc-1")["metadata"]["items"]}
    assert items["note"] == hostile
    for image in ("projects/x/global/images/../../y", "projects/x/global/images/a b",
                  "https://evil.example/compute/v1/projects/x/global/images/y"):
        with pytest.raises(ConfigError, match="not an image path"):
            make_provider(gce={"image": image}).check_config()


def test_a_404_for_the_zonal_machine_type_fails_over_but_another_404_does_not(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    fake_gce.fail(
        "instances.insert", 404, zone="us-central1-a", times=None,
        message="The resource 'projects/fake-project/zones/us-central1-a/machineTypes/"
        "e2-standard-2' was not found",
    )
    provider = make_provider()
    up(provider)
    assert [n.zone for n in provider.non_terminated_nodes()] == ["us-central1-b"]
    fake_gce.clear_faults()
    fake_gce.fail(
        "instances.insert", 404, times=None,
        message="The resource 'projects/fake-project/regions/us-central1/subnetworks/x' "
        "was not found",
    )
    from infra.errors import CapacityError, ProviderError

    with pytest.raises(ProviderError) as caught:
        provider.create_nodes(["pc-2"])
    assert not isinstance(caught.value, CapacityError)
