"""The fake GCE refuses what real Compute Engine refuses (issue 18): each
rule of tests/fake_gce/catalog.py, through the real google-cloud-compute
client."""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from tests.fake_gce import FakeGce
from tests.fake_gce import catalog as fake_catalog
from tests.test_fake_gce import PROJECT, ZONE, Api, instance_body

pytest_plugins = ["tests.fake_gce.fixtures"]

DLVM = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11"


@pytest.fixture
def api(fake_gce: FakeGce) -> Api:
    return Api(fake_gce)


def _kwargs(fake: FakeGce) -> dict[str, Any]:
    return {
        "credentials": AnonymousCredentials(),
        "client_options": ClientOptions(api_endpoint=fake.endpoint),
    }


def body(
    name: str,
    machine: str = "e2-standard-2",
    zone: str = ZONE,
    *,
    gpus: tuple[str, int] | None = None,
    image: str = "projects/debian-cloud/global/images/family/debian-12",
    disk_gb: int = 20,
    disk_type: str | None = None,
    nic: compute_v1.NetworkInterface | None = None,
) -> compute_v1.Instance:
    inst = instance_body(name, zone)
    inst.machine_type = f"zones/{zone}/machineTypes/{machine}"
    init = inst.disks[0].initialize_params
    init.source_image = image
    init.disk_size_gb = disk_gb
    if disk_type:
        init.disk_type = f"zones/{zone}/diskTypes/{disk_type}"
    inst.scheduling = compute_v1.Scheduling(on_host_maintenance="TERMINATE")
    if gpus:
        inst.guest_accelerators = [
            compute_v1.AcceleratorConfig(
                accelerator_type=f"projects/{PROJECT}/zones/{zone}/acceleratorTypes/{gpus[0]}",
                accelerator_count=gpus[1],
            )
        ]
    if nic is not None:
        inst.network_interfaces = [nic]
    return inst


def insert(api: Api, inst: compute_v1.Instance, zone: str = ZONE) -> compute_v1.Operation:
    return api.instances.insert_unary(project=PROJECT, zone=zone, instance_resource=inst)


def refusal(api: Api, inst: compute_v1.Instance, zone: str = ZONE) -> dict[str, Any]:
    """The 400 an insert of ``inst`` gets, as its error entry."""
    with pytest.raises(api_exceptions.BadRequest) as refused:
        insert(api, inst, zone)
    return dict(refused.value.errors[0])


def test_gpus_attach_only_to_n1_in_the_counts_gce_offers(fake_gce: FakeGce, api: Api) -> None:
    # Real GCE's words (issue 26): skypilot-org/skypilot#212.
    assert refusal(api, body("e2gpu", gpus=("nvidia-tesla-t4", 1), image=DLVM, disk_gb=50)) == {
        "message": "[nvidia-tesla-t4, e2-standard-2] features are not compatible for creating "
        "instance.",
        "domain": "global",
        "reason": "badRequest",
    }
    with pytest.raises(api_exceptions.BadRequest, match=r"acceleratorCount': '3'.*\[1, 2, 4\]"):
        insert(api, body("three", "n1-standard-8", gpus=("nvidia-tesla-t4", 3), image=DLVM,
                         disk_gb=50))
    g2 = refusal(api, body("g2", "g2-standard-4", gpus=("nvidia-l4", 1), image=DLVM, disk_gb=50))
    assert g2["message"] == (
        "[nvidia-l4, g2-standard-4] features are not compatible for creating instance."
    )
    # A GPU the zone does not offer is a missing resource, as GCE says it
    # (hashicorp/terraform-provider-google#5860).
    p4 = refusal(api, body("p4", "n1-standard-4", "us-central1-b", gpus=("nvidia-tesla-p4", 1),
                           image=DLVM, disk_gb=50), zone="us-central1-b")
    assert p4 == {
        "message": f"The resource 'projects/{PROJECT}/zones/us-central1-b/acceleratorTypes/"
        "nvidia-tesla-p4' was not found",
        "domain": "global",
        "reason": "badRequest",
    }
    assert fake_gce.instances() == []
    api.wait(insert(api, body("ok", "n1-standard-8", gpus=("nvidia-tesla-v100", 8), image=DLVM,
                              disk_gb=50)))
    api.wait(insert(api, body("l4", "g2-standard-24", image=DLVM, disk_gb=50,
                              disk_type="pd-balanced")))
    fake_gce.wait_quiet()
    l4 = api.get("l4")
    # The built-in GPUs are listed on the instance as attached ones are.
    assert [(a.accelerator_type.rsplit("/", 1)[-1], a.accelerator_count)
            for a in l4.guest_accelerators] == [("nvidia-l4", 2)]


def test_machine_types_are_offered_per_zone(fake_gce: FakeGce, api: Api) -> None:
    with pytest.raises(api_exceptions.BadRequest) as refused:
        insert(api, body("g2f", "g2-standard-4", "us-central1-f", image=DLVM, disk_gb=50),
               zone="us-central1-f")
    assert refused.value.errors[0]["reason"] == "invalid"
    assert "Machine type with name 'g2-standard-4' does not exist in zone 'us-central1-f'" in (
        refused.value.message
    )
    assert "g2-standard-4" not in fake_catalog.MACHINE_TYPES["us-central1-f"]


def test_the_boot_disk_fits_its_image_and_the_machine_family(
    fake_gce: FakeGce, api: Api
) -> None:
    with pytest.raises(api_exceptions.BadRequest, match="cannot be smaller than the image size"):
        insert(api, body("small", "n1-standard-4", image=DLVM, disk_gb=20))
    with pytest.raises(api_exceptions.BadRequest, match=r"\[pd-standard\] features"):
        insert(api, body("pdstd", "g2-standard-4", image=DLVM, disk_gb=50,
                         disk_type="pd-standard"))
    with pytest.raises(api_exceptions.NotFound, match="images/family/no-such"):
        insert(api, body("noimg", image="projects/debian-cloud/global/images/family/no-such"))
    images = compute_v1.ImagesClient(**_kwargs(fake_gce))
    dlvm = images.get_from_family(project="deeplearning-platform-release",
                                  family="common-cu124-debian-11")
    assert dlvm.disk_size_gb == 50 and dlvm.family == "common-cu124-debian-11"
    debian = images.get_from_family(project="debian-cloud", family="debian-12")
    assert images.get(project="debian-cloud", image=debian.name).disk_size_gb == 10
    with pytest.raises(api_exceptions.NotFound):
        images.get_from_family(project="debian-cloud", family="debian-99")


def test_custom_mode_networks_need_a_subnetwork_of_the_zones_region(
    fake_gce: FakeGce, api: Api
) -> None:
    fake_gce.add_network("vpc", {"us-central1": ["sub-a"], "europe-west1": ["sub-e"]})
    networks = compute_v1.NetworksClient(**_kwargs(fake_gce))
    vpc = networks.get(project=PROJECT, network="vpc")
    assert vpc.auto_create_subnetworks is False
    assert sorted(s.rsplit("/", 1)[-1] for s in vpc.subnetworks) == ["sub-a", "sub-e"]
    assert networks.get(project=PROJECT, network="default").auto_create_subnetworks is True
    with pytest.raises(api_exceptions.BadRequest, match="Subnetwork should be specified"):
        insert(api, body("nosub", nic=compute_v1.NetworkInterface(network="global/networks/vpc")))
    with pytest.raises(api_exceptions.BadRequest, match="same region"):
        insert(api, body("wrongregion", nic=compute_v1.NetworkInterface(
            network="global/networks/vpc", subnetwork="regions/europe-west1/subnetworks/sub-e")))
    with pytest.raises(api_exceptions.NotFound, match="networks/nope"):
        insert(api, body("nonet", nic=compute_v1.NetworkInterface(network="global/networks/nope")))
    api.wait(insert(api, body("good", nic=compute_v1.NetworkInterface(
        network="global/networks/vpc", subnetwork="regions/us-central1/subnetworks/sub-a"))))


def test_the_default_network_comes_with_gces_default_rules(fake_gce: FakeGce, api: Api) -> None:
    rules = {r.name: r for r in api.firewalls.list(project=PROJECT)}
    assert set(rules) == {
        "default-allow-internal", "default-allow-ssh", "default-allow-rdp", "default-allow-icmp"
    }
    assert all(r.priority == 65534 for r in rules.values())
    assert list(rules["default-allow-ssh"].source_ranges) == ["0.0.0.0/0"]
    assert list(rules["default-allow-internal"].source_ranges) == ["10.128.0.0/9"]
    api.wait(insert(api, body("vm")))
    api.wait(insert(api, body("other")))
    fake_gce.wait_quiet()
    # With only the defaults, anyone reaches SSH and any VM every port.
    assert fake_gce.reachable("vm", 22, source_ip="192.0.2.1")
    assert fake_gce.reachable("vm", 2222, source="other")
    assert not fake_gce.reachable("vm", 2222, source_ip="192.0.2.1")


def test_rules_are_evaluated_by_priority_deny_first() -> None:
    def rule(name: str, priority: int, kind: str, ranges: list[str]) -> dict[str, Any]:
        return {"name": name, "network": "x/default", "priority": priority,
                kind: [{"IPProtocol": "tcp", "ports": ["22"]}], "sourceRanges": ranges}

    allow_me = rule("me", 1000, "allowed", ["198.51.100.7/32"])
    deny_all = rule("deny", 65000, "denied", ["0.0.0.0/0"])
    allow_all = rule("open", 65534, "allowed", ["0.0.0.0/0"])

    def ok(rules: list[dict[str, Any]], ip: str) -> bool:
        return fake_catalog.ingress_allowed(
            rules, network="default", target_tags=[], port=22, source_ip=ip
        )

    assert ok([allow_me, deny_all, allow_all], "198.51.100.7")
    assert not ok([allow_me, deny_all, allow_all], "192.0.2.1")
    assert ok([allow_me, allow_all], "192.0.2.1")
    assert not ok([], "198.51.100.7")  # the implied deny
    same = rule("deny-same", 1000, "denied", ["198.51.100.7/32"])
    assert not ok([allow_me, same], "198.51.100.7")  # a deny wins a tie


def test_project_metadata_is_read_with_projects_get(fake_gce: FakeGce) -> None:
    projects = compute_v1.ProjectsClient(**_kwargs(fake_gce))
    assert list(projects.get(project=PROJECT).common_instance_metadata.items) == []
    fake_gce.project_metadata[PROJECT] = {"enable-oslogin": "TRUE"}
    items = projects.get(project=PROJECT).common_instance_metadata.items
    assert [(i.key, i.value) for i in items] == [("enable-oslogin", "TRUE")]


def test_a_pending_stop_instance_cannot_be_started_until_terminated(
    fake_gce: FakeGce, api: Api
) -> None:
    api.wait(insert(api, body("vm")))
    fake_gce.wait_quiet()
    fake_gce.latency.stop = 0.3
    fake_gce.pending_stop("vm")
    assert api.get("vm").status == "PENDING_STOP"
    with pytest.raises(api_exceptions.BadRequest, match="not ready"):
        api.instances.start_unary(project=PROJECT, zone=ZONE, instance="vm")


def test_a_firewall_rule_is_for_a_network_of_its_own_project(
    fake_gce: FakeGce, api: Api
) -> None:
    fake_gce.add_network("shared", {"us-central1": ["sub-s"]}, project="host-project")

    def rule(network: str) -> compute_v1.Firewall:
        return compute_v1.Firewall(
            name="r", network=network, source_ranges=["0.0.0.0/0"],
            allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])],
        )

    with pytest.raises(api_exceptions.BadRequest, match="Cross project referencing"):
        api.firewalls.insert_unary(
            project=PROJECT, firewall_resource=rule("projects/host-project/global/networks/shared")
        )
    with pytest.raises(api_exceptions.NotFound, match="networks/nope"):
        api.firewalls.insert_unary(project=PROJECT, firewall_resource=rule("global/networks/nope"))
    api.firewalls.insert_unary(project="host-project",
                               firewall_resource=rule("global/networks/shared"))
    fake_gce.wait_quiet()
    assert [f["name"] for f in fake_gce.firewalls()] == ["r"]


# -- issue 26: the answers the review found missing --------------------------------------


def test_a_machine_type_with_local_ssd_is_stopped_only_when_told_what_of_it(
    fake_gce: FakeGce, api: Api
) -> None:
    api.wait(insert(api, body("a2u", "a2-ultragpu-1g", image=DLVM, disk_gb=50)))
    api.wait(insert(api, body("plain")))
    fake_gce.wait_quiet()
    scratch = [d for d in api.get("a2u").disks if d.type_ == "SCRATCH"]
    assert [(d.disk_size_gb, d.interface) for d in scratch] == [(375, "NVME")]
    assert fake_catalog.LOCAL_SSD_DISKS["a2-ultragpu-1g"] == 1
    # skypilot-org/skypilot#2586, word for word.
    with pytest.raises(api_exceptions.BadRequest) as refused:
        api.instances.stop_unary(project=PROJECT, zone=ZONE, instance="a2u")
    assert dict(refused.value.errors[0]) == {
        "message": "VM has a Local SSD attached but an undefined value for `discard-local-ssd`."
        " If using gcloud, please add `--discard-local-ssd=false` or `--discard-local-ssd=true`"
        " to your command.",
        "domain": "global",
        "reason": "badRequest",
    }
    api.wait(api.instances.stop_unary(project=PROJECT, zone=ZONE, instance="plain"))
    # discardLocalSsd=false (a proto3 optional: sent although false) keeps the data.
    keep = compute_v1.StopInstanceRequest(
        project=PROJECT, zone=ZONE, instance="a2u", discard_local_ssd=False
    )
    api.wait(api.instances.stop_unary(request=keep))
    fake_gce.wait_quiet()
    stopped = api.get("a2u")
    assert stopped.status == "TERMINATED"
    assert [d.saved_state for d in stopped.disks if d.type_ == "SCRATCH"] == ["PRESERVED"]
    assert [c.query.get("discardLocalSsd") for c in fake_gce.calls
            if c.op == "instances.stop" and c.name == "a2u"] == [None, "false"]


def test_a_stockout_may_be_answered_at_once_as_http_503(fake_gce: FakeGce, api: Api) -> None:
    fake_gce.stockout(ZONE, http=True)
    with pytest.raises(api_exceptions.ServiceUnavailable) as refused:
        insert(api, body("vm"))
    assert refused.value.errors[0]["message"] == (
        f"The zone 'projects/{PROJECT}/zones/{ZONE}' does not have enough resources available "
        "to fulfill the request.  Try a different zone, or try again later."
    )
    assert fake_gce.instances() == []


def test_a3_ultra_comes_with_eight_h200s(fake_gce: FakeGce, api: Api) -> None:
    api.wait(insert(api, body("h200", "a3-ultragpu-8g", image=DLVM, disk_gb=50,
                              disk_type="pd-balanced")))
    fake_gce.wait_quiet()
    inst = api.get("h200")
    assert [(a.accelerator_type.rsplit("/", 1)[-1], a.accelerator_count)
            for a in inst.guest_accelerators] == [("nvidia-h200-141gb", 8)]
    assert sum(d.type_ == "SCRATCH" for d in inst.disks) == 32
