"""GceProvider against the fake Compute API, through the real client library."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from infra.config.loader import ClusterConfig
from infra.errors import (
    CapacityError,
    ConfigError,
    CredentialsError,
    HostKeyChanged,
    ProviderError,
    StateError,
)
from infra.providers.base import Node, NodeState
from infra.providers.gce import CLUSTER_LABEL, GceProvider, RetryPolicy
from infra.providers.gce.pricing import table as pricing
from infra.state.folder import ClusterState
from infra.transport.host_keys import HostKeys
from tests.fake_gce import Call, FakeGce
from tests.fake_gce import catalog as fake_catalog
from tests.fake_gce.sshd import LoopbackBackend, LoopbackSshd, key_line

pytest_plugins = ["tests.fake_gce.fixtures"]

NODES = ["pc-1", "pc-2", "pc-3", "pc-4"]
ZONE_A, ZONE_B = "us-central1-a", "us-central1-b"

MakeProvider = Callable[..., GceProvider]


@pytest.fixture
def make_provider(gce_config: Callable[..., ClusterConfig]) -> MakeProvider:
    def make(**overrides: Any) -> GceProvider:
        config = gce_config(**overrides)
        return GceProvider(config, ClusterState(config.name))

    return make


@pytest.fixture
def provider(make_provider: MakeProvider) -> GceProvider:
    return make_provider()


def up(provider: GceProvider, names: list[str] | None = None) -> list[Node]:
    provider.prepare()
    provider.create_nodes(names or provider.config.nodes)
    return provider.non_terminated_nodes()


def by_name(nodes: list[Node]) -> dict[str, Node]:
    return {n.name: n for n in nodes}


def inserts(fake: FakeGce) -> list[Call]:
    return [c for c in fake.calls if c.op == "instances.insert"]


# -- creating --------------------------------------------------------------------------------


def test_first_create_of_four_nodes_runs_in_parallel(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    fake_gce.latency.provision = 0.4
    fake_gce.latency.staging = 0.1
    provider.prepare()
    # The bound is the sequential time measured here, on this machine as
    # busy as it is now, not a number of seconds.
    started = time.monotonic()
    for name in NODES:
        provider.create_nodes([name])
    sequential = time.monotonic() - started
    provider.terminate_nodes(NODES)
    started = time.monotonic()
    provider.create_nodes(NODES)
    four = time.monotonic() - started
    # In parallel about one node's time: a quarter of one after another.
    assert four < sequential / 2, (sequential, four)
    assert {i["name"]: i["status"] for i in fake_gce.instances()} == dict.fromkeys(
        NODES, "RUNNING"
    )


def test_create_waits_for_running_and_reports_addresses_and_zone(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    fake_gce.latency.staging = 0.2  # the insert operation is DONE while still STAGING
    nodes = up(provider)
    assert [n.name for n in nodes] == NODES
    for node in nodes:
        assert node.state is NodeState.RUNNING and node.status == "RUNNING"
        assert node.internal_ip and node.internal_ip.startswith("10.128.")
        assert node.external_ip and node.external_ip.startswith("203.0.113.")
        assert node.ssh_host == node.external_ip and node.ssh_port == 22
        assert node.zone == ZONE_A and node.machine_type == "e2-standard-2"
        assert node.accelerators is None and node.preemptible is False
    assert len({n.internal_ip for n in nodes}) == 4


def test_instance_request_carries_labels_tag_key_disk_and_network(
    fake_gce: FakeGce, make_provider: MakeProvider, tfcluster_home: Path
) -> None:
    fake_gce.add_network("tf-net", {"us-central1": ["tf-subnet"]})
    provider = make_provider(
        gce={"labels": {"team": "ml"}, "disk_gb": 30, "disk_type": "pd-ssd",
             "subnetwork": "tf-subnet", "network": "tf-net"}
    )
    up(provider, ["pc-1"])
    body = inserts(fake_gce)[0].body
    assert body["labels"] == {
        CLUSTER_LABEL: "tfc-test", "tfcluster-role": "ps-chief", "team": "ml",
        "tfcluster-id": provider.state.cluster_id(),
    }
    assert body["tags"]["items"] == ["tfcluster-tfc-test"]
    assert body["machineType"] == f"zones/{ZONE_A}/machineTypes/e2-standard-2"
    metadata = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    public_key = (tfcluster_home / "clusters/tfc-test/id_ed25519.pub").read_text().strip()
    assert metadata == {
        "ssh-keys": f"tfcluster:{public_key}",
        "enable-oslogin": "FALSE",
        "enable-guest-attributes": "TRUE",
    }
    assert public_key.startswith("ssh-ed25519 ") and public_key.endswith(" tfcluster-tfc-test")
    (disk,) = body["disks"]
    assert disk["boot"] and disk["autoDelete"]
    assert disk["initializeParams"]["sourceImage"] == (
        "projects/debian-cloud/global/images/family/debian-12"
    )
    assert int(disk["initializeParams"]["diskSizeGb"]) == 30
    assert disk["initializeParams"]["diskType"] == f"zones/{ZONE_A}/diskTypes/pd-ssd"
    (nic,) = body["networkInterfaces"]
    assert nic["network"] == "global/networks/tf-net"
    assert nic["subnetwork"] == "regions/us-central1/subnetworks/tf-subnet"
    assert nic["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"
    # On-demand, no GPU: GCE's defaults (live migration, automatic restart).
    assert body.get("scheduling", {}).get("provisioningModel") is None
    assert "guestAccelerators" not in body
    worker = make_provider().non_terminated_nodes()[0]
    assert worker.labels["tfcluster-role"] == "ps-chief"


def test_spot_nodes_stop_on_preemption_instead_of_being_deleted(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    provider = make_provider(gce={"preemptible": True})
    nodes = up(provider, ["pc-2"])
    scheduling = inserts(fake_gce)[0].body["scheduling"]
    assert scheduling == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "STOP",
        "automaticRestart": False,
        "onHostMaintenance": "TERMINATE",
    }
    assert nodes[0].preemptible is True


def test_accelerators_become_guest_accelerators_that_terminate_on_maintenance(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    provider = make_provider(gce={
        "accelerator": {"type": "nvidia-tesla-t4", "count": 2},
        "machine_type": "n1-standard-8",
        "image": "projects/deeplearning-platform-release/global/images/family/"
        "common-cu124-debian-11",
    })
    (node,) = up(provider, ["pc-1"])
    body = inserts(fake_gce)[0].body
    metadata = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    # The Deep Learning VM image installs the driver only when asked, and
    # is larger than the 20 GB default disk: the disk follows the image.
    assert metadata["install-nvidia-driver"] == "True"
    assert body["disks"][0]["initializeParams"]["diskSizeGb"] == "50"
    assert body["guestAccelerators"] == [
        {
            "acceleratorType": "projects/fake-project/zones/us-central1-a/acceleratorTypes/"
            "nvidia-tesla-t4",
            "acceleratorCount": 2,
        }
    ]
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert node.accelerators == "2 x nvidia-tesla-t4"
    cost = provider.hourly_cost([node])
    assert cost is not None and cost > 2 * 0.35


@pytest.mark.parametrize(
    ("happens", "says"),
    [
        ("preempt", "pc-1 stopped while starting (a Spot VM may have been preempted)"),
        ("remove_instance", "pc-1 disappeared while waiting for it to start"),
    ],
)
def test_a_node_lost_while_it_boots_is_an_error_naming_it(
    fake_gce: FakeGce, make_provider: MakeProvider, happens: str, says: str
) -> None:
    provider = make_provider(gce={"preemptible": True})
    fake_gce.latency.provision = 0.05
    fake_gce.latency.staging = 1.5  # the insert operation is DONE; the VM is still STAGING
    timer = threading.Timer(0.6, getattr(fake_gce, happens), args=("pc-1",))
    timer.start()
    try:
        with pytest.raises(ProviderError) as exc:
            provider.create_nodes(["pc-1"])
    finally:
        timer.join()
    assert says in str(exc.value)
    assert exc.value.hint == "run `deploy.py up` again"


def test_create_of_a_node_that_exists_stopped_starts_it(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    up(provider, ["pc-1"])
    provider.stop_nodes(["pc-1"])
    fake_gce.reset_calls()
    provider.create_nodes(["pc-1"])  # listed as missing by a plan made just before
    assert [c.op for c in fake_gce.mutating_calls()] == ["instances.start"]
    assert provider.non_terminated_nodes()[0].state is NodeState.RUNNING


def test_up_twice_changes_nothing(fake_gce: FakeGce, provider: GceProvider) -> None:
    up(provider)
    fake_gce.reset_calls()
    again = GceProvider(provider.config, provider.state)
    again.prepare()
    again.create_nodes(NODES)  # all exist and run: nothing to create
    assert fake_gce.mutating_calls() == []
    assert len(fake_gce.instances()) == 4


def test_listing_and_planning_make_no_mutating_call(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    assert provider.non_terminated_nodes() == []
    assert provider.shared_resources() == [
        "firewall rule tfcluster-tfc-test-grpc",
        "firewall rule tfcluster-tfc-test-grpc-deny (TensorFlow ports closed to all other "
        "sources)",
        "firewall rule tfcluster-tfc-test-ssh (SSH from 198.51.100.7/32)",
        "firewall rule tfcluster-tfc-test-ssh-deny (SSH closed to all other sources)",
    ]
    provider.hourly_cost([])
    assert fake_gce.ops_called() == ["instances.aggregatedList"]
    assert fake_gce.mutating_calls() == []


def test_a_node_deleted_by_hand_is_recreated_in_the_zone_of_the_others(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    fake_gce.stockout(ZONE_A, times=4)  # the first create lands in zone b
    up(provider)
    assert {n.zone for n in provider.non_terminated_nodes()} == {ZONE_B}
    fake_gce.remove_instance("pc-3")
    missing = [n for n in NODES if n not in by_name(provider.non_terminated_nodes())]
    assert missing == ["pc-3"]
    fake_gce.reset_calls()
    provider.create_nodes(missing)
    # zone a has capacity again, but pc-3 joins the others in zone b
    assert [(c.name, c.zone) for c in inserts(fake_gce)] == [("pc-3", ZONE_B)]
    assert by_name(provider.non_terminated_nodes())["pc-3"].state is NodeState.RUNNING


def test_stockout_fails_over_to_the_next_zone_and_cleans_up_the_first(
    fake_gce: FakeGce, provider: GceProvider, caplog: pytest.LogCaptureFixture
) -> None:
    # Two nodes get created in zone a; two hit the stockout and are left half-created.
    fake_gce.stockout(ZONE_A, after=2, leave_instance=True)
    with caplog.at_level(logging.WARNING, logger="tfcluster"):
        nodes = up(provider)
    assert {n.name: n.zone for n in nodes} == dict.fromkeys(NODES, ZONE_B)
    assert all(n.state is NodeState.RUNNING for n in nodes)
    assert [i["zone"].rsplit("/", 1)[1] for i in fake_gce.instances()] == [ZONE_B] * 4
    deleted = sorted(c.name or "" for c in fake_gce.calls
                     if c.op == "instances.delete" and c.zone == ZONE_A)
    assert deleted == NODES  # the two that worked and the two half-created ones
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith("zone us-central1-a: ZONE_RESOURCE_POOL_EXHAUSTED: ")
    assert warnings[0].endswith("; trying zone us-central1-b")


def test_quota_on_insert_fails_over_too(fake_gce: FakeGce, provider: GceProvider) -> None:
    fake_gce.quota_exceeded(ZONE_A, http=True)
    nodes = up(provider)
    assert {n.zone for n in nodes} == {ZONE_B}


def test_every_zone_exhausted_is_one_capacity_error_with_each_reason(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    fake_gce.stockout(ZONE_A, code="ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")
    fake_gce.quota_exceeded(ZONE_B)
    provider.prepare()
    with pytest.raises(CapacityError) as exc:
        provider.create_nodes(NODES)
    message = str(exc.value)
    assert exc.value.exit_code == 5
    assert "\n" not in message
    assert message.startswith("no zone could create pc-1, pc-2, pc-3, pc-4: ")
    assert f"{ZONE_A}: ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS: The zone " in message
    assert f"{ZONE_B}: QUOTA_EXCEEDED: Quota 'CPUS' exceeded" in message
    assert exc.value.hint and "gce.zones" in exc.value.hint
    assert fake_gce.instances() == []


def test_an_instance_of_another_cluster_with_our_name_is_not_taken_over(
    fake_gce: FakeGce, provider: GceProvider, make_provider: MakeProvider
) -> None:
    other = make_provider(name="other")
    up(other, ["pc-3"])
    with pytest.raises(ProviderError, match="pc-3 already exists in us-central1-a and is not "
                       "part of cluster tfc-test"):
        provider.create_nodes(["pc-3"])
    assert by_name(other.non_terminated_nodes())["pc-3"].state is NodeState.RUNNING


def test_a_conflict_on_our_own_instance_is_adopted(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    # The insert went through, but its answer got lost: the retry meets 409.
    def insert_first(call: Call) -> None:
        fake_gce._insert(call.project or "", call.zone or "", call.body)

    fake_gce.hook("instances.insert", insert_first, name="pc-2")
    up(provider)
    assert [c.status for c in inserts(fake_gce) if c.name == "pc-2"] == [409]
    assert sorted(i["name"] for i in fake_gce.instances()) == NODES
    assert all(n.state is NodeState.RUNNING for n in provider.non_terminated_nodes())


def test_transient_errors_are_retried(fake_gce: FakeGce, provider: GceProvider) -> None:
    fake_gce.fail("instances.insert", 503, times=2, name="pc-1")
    fake_gce.fail("instances.aggregatedList", 503, times=1)
    fake_gce.fail("zoneOperations.wait", 429, times=1)
    fake_gce.fail("firewalls.get", 500, times=1)
    nodes = up(provider)
    assert all(n.state is NodeState.RUNNING for n in nodes)
    assert [c.status for c in inserts(fake_gce) if c.name == "pc-1"] == [503, 503, 200]


def test_an_api_that_keeps_failing_gives_up_with_a_provider_error(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    fake_gce.fail("instances.aggregatedList", 503, times=None)
    with pytest.raises(ProviderError) as exc:
        provider.non_terminated_nodes()
    assert str(exc.value).startswith(
        "list the instances of cluster tfc-test: the Compute API kept answering HTTP 503: "
        "The service is currently unavailable; gave up after 5 attempts in "
    )
    assert len(fake_gce.calls) == GceProvider.retry_policy.attempts


def test_an_unreachable_api_is_a_provider_error(make_provider: MakeProvider) -> None:
    provider = make_provider(gce={"api_endpoint": "http://127.0.0.1:9"})
    with pytest.raises(ProviderError, match="cannot reach the Compute API at http://127"):
        provider.non_terminated_nodes()


def test_a_slow_operation_times_out_naming_it_and_the_node(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    provider = make_provider(gce={"operation_timeout": 0.3})
    up(provider, ["pc-1"])
    fake_gce.latency.stop = 3.0
    with pytest.raises(ProviderError) as exc:
        provider.stop_nodes(["pc-1"])
    assert "stop pc-1 in us-central1-a: operation operation-" in str(exc.value)
    assert "not done after 0.3 s (gce.operation_timeout)" in str(exc.value)


# -- stop, start, delete ------------------------------------------------------------------------


def test_stop_and_start_rediscover_the_new_external_ips(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    before = by_name(up(provider))
    provider.stop_nodes(NODES)
    stopped = by_name(provider.non_terminated_nodes())
    assert {n.state for n in stopped.values()} == {NodeState.STOPPED}
    assert {n.status for n in stopped.values()} == {"TERMINATED"}
    assert all(n.external_ip is None for n in stopped.values())
    fake_gce.reset_calls()
    provider.stop_nodes(NODES)  # already stopped
    assert fake_gce.mutating_calls() == []
    provider.start_nodes(NODES)
    after = by_name(provider.non_terminated_nodes())
    for name in NODES:
        assert after[name].state is NodeState.RUNNING
        assert after[name].internal_ip == before[name].internal_ip
        assert after[name].external_ip not in (None, before[name].external_ip)
    fake_gce.reset_calls()
    provider.start_nodes(NODES)  # already running
    assert fake_gce.mutating_calls() == []


def test_stop_and_start_are_parallel(fake_gce: FakeGce, provider: GceProvider) -> None:
    up(provider)
    fake_gce.latency.stop = 0.4
    fake_gce.latency.start = 0.4
    started = time.monotonic()
    for name in NODES:
        provider.stop_nodes([name])
        provider.start_nodes([name])
    sequential = time.monotonic() - started
    started = time.monotonic()
    provider.stop_nodes(NODES)
    provider.start_nodes(NODES)
    parallel = time.monotonic() - started
    assert parallel < sequential / 2, (sequential, parallel)  # about a quarter
    assert {n.state for n in provider.non_terminated_nodes()} == {NodeState.RUNNING}


def test_start_waits_for_a_node_that_is_still_stopping(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    up(provider, ["pc-1"])
    fake_gce.latency.stop = 0.3
    provider._instance_action("stop", ZONE_A, "pc-1")
    time.sleep(0.05)
    assert provider.non_terminated_nodes()[0].state is NodeState.STOPPING
    provider.start_nodes(["pc-1"])  # GCE refuses a start while STOPPING: wait first
    assert provider.non_terminated_nodes()[0].state is NodeState.RUNNING


def test_a_preempted_node_is_reported_stopped_and_starts_again(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    provider = make_provider(gce={"preemptible": True})
    up(provider)
    fake_gce.preempt("pc-3")
    nodes = by_name(provider.non_terminated_nodes())
    assert nodes["pc-3"].state is NodeState.STOPPED and nodes["pc-3"].external_ip is None
    assert nodes["pc-2"].state is NodeState.RUNNING
    provider.start_nodes(["pc-3"])
    assert by_name(provider.non_terminated_nodes())["pc-3"].state is NodeState.RUNNING


def test_a_suspended_node_is_stopped_and_resumed(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    up(provider, ["pc-1"])
    fake_gce.suspend("pc-1")
    assert provider.non_terminated_nodes()[0].state is NodeState.STOPPED
    provider.start_nodes(["pc-1"])
    assert [c.op for c in fake_gce.mutating_calls()][-1] == "instances.resume"
    assert provider.non_terminated_nodes()[0].state is NodeState.RUNNING


def test_start_of_a_missing_node_is_a_state_error(provider: GceProvider) -> None:
    with pytest.raises(StateError, match="pc-2 does not exist"):
        provider.start_nodes(["pc-2"])


def test_terminate_deletes_in_parallel_and_a_404_means_gone(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    up(provider)
    fake_gce.latency.delete = 0.4
    started = time.monotonic()
    for name in NODES:
        provider.terminate_nodes([name])
    sequential = time.monotonic() - started
    up(provider)
    fake_gce.hook("instances.delete", lambda call: fake_gce.remove_instance("pc-2"),
                  name="pc-2")
    fake_gce.reset_calls()
    started = time.monotonic()
    provider.terminate_nodes(NODES)
    parallel = time.monotonic() - started
    assert parallel < sequential / 2, (sequential, parallel)  # about a quarter
    assert [c.status for c in fake_gce.calls if c.name == "pc-2"
            and c.op == "instances.delete"] == [404]
    assert fake_gce.instances() == [] and provider.non_terminated_nodes() == []
    fake_gce.reset_calls()
    provider.terminate_nodes(NODES)  # nothing left: nothing to do
    assert fake_gce.mutating_calls() == []


def test_a_delete_that_finds_its_node_already_gone_is_fine(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    up(provider, ["pc-1"])
    fake_gce.latency.delete = 0.3
    # Someone else's delete is under way; ours queues behind it and finds nothing.
    provider._instance_action("delete", ZONE_A, "pc-1")
    provider.terminate_nodes(["pc-1"])
    fake_gce.wait_quiet()
    failed = [o for o in fake_gce.operations() if o.get("error")]
    assert [o["error"]["errors"][0]["code"] for o in failed] == ["RESOURCE_NOT_FOUND"]
    assert fake_gce.instances() == []


def test_terminate_deletes_a_name_found_in_two_zones(
    fake_gce: FakeGce, provider: GceProvider, make_provider: MakeProvider
) -> None:
    up(provider, ["pc-1"])
    # Not something tfcluster does (it finds pc-1 wherever it is), but a
    # person or a failed cleanup can.
    fake_gce._insert("fake-project", ZONE_B, inserts(fake_gce)[0].body)
    fake_gce.wait_quiet()
    assert len(fake_gce.instances()) == 2
    assert len(provider.non_terminated_nodes()) == 1
    provider.terminate_nodes(["pc-1"])
    assert fake_gce.instances() == []


# -- firewall, key, labels --------------------------------------------------------------------


def test_firewall_rules_open_grpc_only_between_the_clusters_nodes(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    provider.prepare()
    grpc = fake_gce.firewall("tfcluster-tfc-test-grpc")
    ssh = fake_gce.firewall("tfcluster-tfc-test-ssh")
    assert grpc is not None and ssh is not None
    assert grpc["allowed"] == [{"IPProtocol": "tcp", "ports": ["2222", "2223", "2224"]}]
    assert grpc["sourceTags"] == grpc["targetTags"] == ["tfcluster-tfc-test"]
    assert "sourceRanges" not in grpc  # never an address range, 0.0.0.0/0 least of all
    assert grpc["direction"] == "INGRESS"
    assert grpc["network"].endswith("/global/networks/default")
    assert ssh["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert ssh["sourceRanges"] == ["198.51.100.7/32"]
    assert ssh["targetTags"] == ["tfcluster-tfc-test"] and "sourceTags" not in ssh


def test_tensorflow_ports_are_denied_to_everyone_but_the_clusters_nodes(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    # default-allow-internal (priority 65534, 10.128.0.0/9, all ports) would
    # otherwise let any VM of the network run code on the TF servers.
    provider.prepare()
    deny = fake_gce.firewall("tfcluster-tfc-test-grpc-deny")
    grpc = fake_gce.firewall("tfcluster-tfc-test-grpc")
    assert deny is not None and grpc is not None
    assert deny["denied"] == [{"IPProtocol": "tcp", "ports": ["2222", "2223", "2224"]}]
    assert "allowed" not in deny
    assert deny["sourceRanges"] == ["0.0.0.0/0"] and "sourceTags" not in deny
    assert deny["targetTags"] == ["tfcluster-tfc-test"]
    assert deny["direction"] == "INGRESS" and deny["network"] == grpc["network"]
    # Weaker than the tag allow rule, stronger than default-allow-internal.
    assert grpc["priority"] < deny["priority"] < 65534
    # A rule changed by hand is put back; a second prepare changes nothing.
    with fake_gce._lock:
        fake_gce._firewalls[("fake-project", "tfcluster-tfc-test-grpc-deny")]["priority"] = 65535
    fake_gce.reset_calls()
    provider.prepare()
    assert [c.name for c in fake_gce.mutating_calls()] == ["tfcluster-tfc-test-grpc-deny"]
    fixed = fake_gce.firewall("tfcluster-tfc-test-grpc-deny")
    assert fixed is not None and fixed["priority"] == deny["priority"]
    fake_gce.reset_calls()
    provider.prepare()
    assert fake_gce.mutating_calls() == []


def test_ssh_open_to_the_world_is_warned_about_once_per_up(
    make_provider: MakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    provider = make_provider(gce={"ssh_source_ranges": ["0.0.0.0/0"]})
    assert provider.shared_resources()[-1] == (
        "firewall rule tfcluster-tfc-test-ssh (SSH from 0.0.0.0/0): open to the whole internet"
    )
    with caplog.at_level(logging.WARNING, logger="tfcluster"):
        provider.prepare()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "SSH to the nodes is open to the whole internet (gce.ssh_source_ranges: 0.0.0.0/0); "
        "set it to your own address range"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tfcluster"):
        make_provider().prepare()  # 198.51.100.7/32: nothing to warn about
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []


def test_prepare_is_idempotent_and_repairs_drifted_rules(
    fake_gce: FakeGce, provider: GceProvider, make_provider: MakeProvider
) -> None:
    provider.prepare()
    fake_gce.reset_calls()
    provider.prepare()
    assert fake_gce.mutating_calls() == []
    # Someone opened gRPC to the world by hand; and the config's ports changed.
    with fake_gce._lock:
        fake_gce._firewalls[("fake-project", "tfcluster-tfc-test-grpc")]["sourceRanges"] = [
            "0.0.0.0/0"
        ]
    changed = make_provider(ports={"ps": 3000, "worker": 3001, "chief": 3002})
    changed.prepare()
    grpc = fake_gce.firewall("tfcluster-tfc-test-grpc")
    assert grpc is not None
    assert "sourceRanges" not in grpc
    assert grpc["allowed"][0]["ports"] == ["3000", "3001", "3002"]
    deny = fake_gce.firewall("tfcluster-tfc-test-grpc-deny")
    assert deny is not None and deny["denied"][0]["ports"] == ["3000", "3001", "3002"]
    assert sorted((c.op, c.name) for c in fake_gce.mutating_calls()) == [
        ("firewalls.update", "tfcluster-tfc-test-grpc"),
        ("firewalls.update", "tfcluster-tfc-test-grpc-deny"),
    ]


def test_release_deletes_every_rule_and_tolerates_their_absence(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    provider.prepare()
    assert len(fake_gce.firewalls()) == 4
    provider.release()
    assert fake_gce.firewalls() == []
    # GCE's own default rules are not ours to delete.
    assert len(fake_gce.firewalls(defaults=True)) == 4
    provider.release()
    deletes = [c for c in fake_gce.calls if c.op == "firewalls.delete"]
    assert sorted(c.name or "" for c in deletes[:4]) == [
        "tfcluster-tfc-test-grpc", "tfcluster-tfc-test-grpc-deny", "tfcluster-tfc-test-ssh",
        "tfcluster-tfc-test-ssh-deny",
    ]
    assert [c.status for c in deletes] == [200] * 4 + [404] * 4


def test_a_new_key_and_changed_labels_reach_existing_nodes(
    fake_gce: FakeGce, provider: GceProvider, make_provider: MakeProvider, tfcluster_home: Path
) -> None:
    up(provider, ["pc-1", "pc-2"])
    key = tfcluster_home / "clusters/tfc-test/id_ed25519"
    old_public = key.with_name("id_ed25519.pub").read_text().strip()
    key.unlink()
    key.with_name("id_ed25519.pub").unlink()  # the state folder was lost
    fake_gce.reset_calls()
    relabelled = make_provider(gce={"labels": {"cost-center": "r-d"}})
    relabelled.prepare()
    new_public = key.with_name("id_ed25519.pub").read_text().strip()
    assert new_public != old_public
    for name in ("pc-1", "pc-2"):
        inst = fake_gce.instance(name)
        items = {i["key"]: i["value"] for i in inst["metadata"]["items"]}
        assert items["ssh-keys"] == f"tfcluster:{new_public}"
        assert inst["labels"]["cost-center"] == "r-d"
        assert inst["labels"][CLUSTER_LABEL] == "tfc-test"
    ops = sorted(c.op for c in fake_gce.mutating_calls())
    assert ops == ["instances.setLabels"] * 2 + ["instances.setMetadata"] * 2


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"Team": "x"}, "'Team' is not a valid GCE label key"),
        ({"team": "Research"}, "gce.labels.team: 'Research' is not a valid GCE label value"),
        ({CLUSTER_LABEL: "x"}, "tfcluster-cluster is tfcluster's own label"),
        ({"tfcluster-id": "0123456789ab"}, "tfcluster-id is tfcluster's own label"),
    ],
)
def test_bad_labels_are_config_errors_before_any_call(
    fake_gce: FakeGce, make_provider: MakeProvider, labels: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_provider(gce={"labels": labels})
    assert fake_gce.calls == []


# -- interruption ----------------------------------------------------------------------------


def test_ctrl_c_mid_create_returns_at_once_and_leaves_only_labelled_instances(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    fake_gce.latency.provision = 3.0
    fake_gce.hook(
        "instances.insert", lambda call: os.kill(os.getpid(), signal.SIGINT), name="pc-3"
    )
    provider.prepare()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        provider.create_nodes(NODES)
    # Returned before any create could have finished (not a fixed number of
    # seconds: a busy machine only makes the return slower, not the creates faster).
    assert time.monotonic() - started < fake_gce.latency.provision
    time.sleep(0.3)
    settled = len(fake_gce.calls)
    time.sleep(0.5)
    assert len(fake_gce.calls) == settled  # the workers stopped calling the API
    # Whatever was requested carries the label: a fresh provider finds and deletes it all.
    again = GceProvider(provider.config, provider.state)
    found = again.non_terminated_nodes()
    assert found and {n.labels[CLUSTER_LABEL] for n in found} == {"tfc-test"}
    again.terminate_nodes([n.name for n in found])
    again.release()
    fake_gce.wait_quiet()
    assert fake_gce.instances() == [] and fake_gce.firewalls() == []


def test_ctrl_c_mid_create_returns_only_once_the_creates_already_sent_are_answered(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    # pc-4's insert is on the wire (its answer slow) when the Ctrl-C lands
    # during pc-3's. Were the interrupted create to return at once, pc-4
    # would appear after it, perhaps after a `down` had listed the nodes.
    on_the_wire = threading.Event()

    def slow(call: Call) -> None:
        on_the_wire.set()
        time.sleep(1.0)

    def interrupt(call: Call) -> None:
        on_the_wire.wait(10)
        os.kill(os.getpid(), signal.SIGINT)

    fake_gce.hook("instances.insert", slow, name="pc-4")
    fake_gce.hook("instances.insert", interrupt, name="pc-3")
    provider.prepare()
    with pytest.raises(KeyboardInterrupt):
        provider.create_nodes(NODES)
    assert on_the_wire.is_set()
    # No waiting here: what was sent is already in.
    assert "pc-4" in {i["name"] for i in fake_gce.instances()}


def test_a_second_ctrl_c_leaves_without_waiting_for_the_calls_already_sent(
    provider: GceProvider,
) -> None:
    # The first Ctrl-C waits for a mutating call on the wire (here one that
    # hangs); a second one leaves at once, even when the kernel hands it to
    # a worker thread rather than the main one.
    from infra.providers.gce.parallel import _mutation

    main = threading.get_ident()
    release = threading.Event()
    hanging = threading.Event()

    def work(item: int) -> None:
        if item == 0:
            with _mutation():
                hanging.set()
                release.wait(60)
            return
        hanging.wait(10)
        signal.pthread_kill(main, signal.SIGINT)  # the first Ctrl-C
        time.sleep(1.0)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # the second, here

    began = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            provider._parallel(work, [0, 1])
        assert time.monotonic() - began < 20  # not the settle's 70 s
    finally:
        release.set()


def test_ctrl_c_while_the_batch_is_still_starting_stops_what_already_started(
    provider: GceProvider,
) -> None:
    # Item 5 interrupts the main thread while it is still starting threads
    # for the later items: items 0-4, already running, must stop too.
    from infra.providers.gce import _pause

    main = threading.get_ident()
    finished: list[int] = []

    def work(item: int) -> None:
        if item == 5:
            signal.pthread_kill(main, signal.SIGINT)
            return
        for _ in range(10):  # ten calls, each a point where a cancelled batch stops
            _pause(0.05)
        finished.append(item)

    with pytest.raises(KeyboardInterrupt):
        provider._parallel(work, list(range(50)))
    time.sleep(1.0)
    assert finished == []


# -- transport and cost -----------------------------------------------------------------------


def test_transport_reaches_the_nodes_at_their_external_ips(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    from infra.transport.ssh import SshTarget, SshTransport

    provider = make_provider(ssh={"port": 2022})
    nodes = up(provider, ["pc-1", "pc-2"])
    transport = provider.transport(nodes)
    assert isinstance(transport, SshTransport)
    assert transport.targets == {
        n.name: SshTarget(n.name, n.external_ip or "", 2022) for n in nodes
    }
    assert transport.key_file == provider.state.key_file
    provider.stop_nodes(["pc-2"])
    with pytest.raises(StateError, match="pc-2 has no external IP"):
        provider.transport(provider.non_terminated_nodes())


def test_hourly_cost_of_running_and_stopped_nodes(
    fake_gce: FakeGce, provider: GceProvider
) -> None:
    nodes = up(provider)
    disk = 20 * 0.10 / 730
    running = provider.hourly_cost(nodes)
    assert running == pytest.approx(4 * (0.067006 + 0.005 + disk), rel=1e-6)
    provider.stop_nodes(NODES)
    stopped = provider.hourly_cost(provider.non_terminated_nodes())
    assert stopped == pytest.approx(4 * disk, rel=1e-6)  # a stopped node still pays its disk
    assert provider.hourly_cost([]) == 0.0


def test_unknown_machine_type_has_no_cost_and_says_why(
    fake_gce: FakeGce, make_provider: MakeProvider, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A machine type GCE offers but pricing/table.py does not know.
    monkeypatch.setitem(
        fake_catalog.MACHINE_TYPES, "us-central1-a",
        (*fake_catalog.MACHINE_TYPES["us-central1-a"], "z9-mega-7"),
    )
    provider = make_provider(gce={"machine_type": "z9-mega-7"})
    nodes = up(provider, ["pc-1"])
    with caplog.at_level(logging.INFO, logger="tfcluster"):
        assert provider.hourly_cost(nodes) is None
    assert "no price known for machine type z9-mega-7" in caplog.text


def test_price_table() -> None:
    assert pricing.PRICES_AS_OF and pricing.REGION == "us-central1"
    assert pricing.machine_hourly("e2-standard-2") == pytest.approx(0.067006, abs=1e-6)
    assert pricing.machine_hourly("n1-standard-1") == pytest.approx(0.0475, abs=1e-4)
    assert pricing.machine_hourly("n2-standard-2") == pytest.approx(0.097118, abs=1e-6)
    assert pricing.machine_hourly("n2d-standard-2") == pytest.approx(0.084492, abs=1e-6)
    assert pricing.machine_hourly("c3-standard-4") == pytest.approx(0.201608, abs=1e-6)
    assert pricing.machine_hourly("e2-medium") == pytest.approx(0.033503)
    assert pricing.machine_hourly("e2-standard-3") is None  # no such size
    assert pricing.machine_hourly("e2-custom-4-8192") is None
    spot = pricing.machine_hourly("e2-standard-2", spot=True)
    assert spot is not None and spot < 0.5 * 0.067006
    assert pricing.gpu_hourly("nvidia-tesla-t4", 2) == pytest.approx(0.70)
    assert pricing.gpu_hourly("nvidia-h100-80gb") is None
    assert pricing.disk_hourly(730, "pd-standard") == pytest.approx(0.04)
    g2 = pricing.node_hourly(
        "g2-standard-4", running=True, accelerators=[("nvidia-l4", 1)], disk_gb=0
    )
    assert g2.usd_per_hour == pytest.approx(0.70683 + 0.005, abs=1e-4)
    elsewhere = pricing.node_hourly("e2-standard-2", running=True, zone="europe-west1-b")
    assert any("europe-west1" in note for note in elsewhere.notes)
    stopped = pricing.node_hourly("unknown-type-1", running=False, disk_gb=10)
    assert stopped.usd_per_hour == pytest.approx(10 * 0.10 / 730)  # the type does not matter


# -- credentials ------------------------------------------------------------------------------


def _service_account_file(path: Path, project: str | None = "sa-project") -> Path:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    info: dict[str, Any] = {
        "type": "service_account",
        "private_key_id": "0123456789abcdef",
        "private_key": pem,
        "client_email": "tfcluster@sa-project.iam.gserviceaccount.com",
        "client_id": "1234567890",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    if project:
        info["project_id"] = project
    path.write_text(json.dumps(info))
    return path


@pytest.fixture
def no_adc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A machine where nobody ran `gcloud auth application-default login`."""
    from google.auth.compute_engine import _metadata

    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud-empty"))
    # Not a GCE VM: do not probe the metadata server (no network here anyway).
    monkeypatch.setattr(_metadata, "_NO_GCE_CHECK", True)


def test_missing_adc_is_a_one_line_credentials_error_with_the_fix(
    no_adc: None, make_provider: MakeProvider
) -> None:
    provider = make_provider(gce={"credentials": "adc"})
    with pytest.raises(CredentialsError) as exc:
        provider.non_terminated_nodes()
    assert exc.value.exit_code == 6
    assert "\n" not in str(exc.value)
    assert "gcloud auth application-default login" in str(exc.value)


def test_adc_from_a_key_file_gives_the_project(
    no_adc: None, fake_gce: FakeGce, make_provider: MakeProvider, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = _service_account_file(tmp_path / "sa.json", project="adc-project")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    provider = make_provider(gce={"credentials": "adc", "project": None})
    assert provider.non_terminated_nodes() == []
    (call,) = fake_gce.calls
    assert call.project == "adc-project"
    # A service account signs its own token (JWT): nothing else was contacted.
    assert (call.authorization or "").startswith("Bearer ey")


def test_a_service_account_key_file(
    no_adc: None, fake_gce: FakeGce, make_provider: MakeProvider, tmp_path: Path
) -> None:
    key = _service_account_file(tmp_path / "sa.json")
    provider = make_provider(gce={"credentials": str(key), "project": None})
    up(provider, ["pc-1"])
    # (the image is read from its own project, debian-cloud)
    assert {c.project for c in fake_gce.calls if not c.op.startswith("images.")} == {
        "sa-project"
    }
    assert all((c.authorization or "").startswith("Bearer ") for c in fake_gce.calls)


def test_project_from_the_environment_wins_over_the_credentials(
    no_adc: None, fake_gce: FakeGce, make_provider: MakeProvider, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = _service_account_file(tmp_path / "sa.json")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "env-project")
    make_provider(gce={"credentials": str(key), "project": None}).non_terminated_nodes()
    assert fake_gce.calls[0].project == "env-project"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("{not json", "is not a usable service-account JSON key"),
        ('{"type": "service_account"}', "is not a usable service-account JSON key"),
    ],
)
def test_bad_key_files_are_credentials_errors(
    no_adc: None, make_provider: MakeProvider, tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "key.json"
    if content is not None:
        path.write_text(content)
    provider = make_provider(gce={"credentials": str(path)})
    with pytest.raises(CredentialsError, match=message):
        provider.non_terminated_nodes()


def test_no_project_anywhere_is_a_credentials_error(
    no_adc: None, make_provider: MakeProvider, tmp_path: Path
) -> None:
    key = _service_account_file(tmp_path / "sa.json", project=None)
    provider = make_provider(gce={"credentials": str(key), "project": None})
    with pytest.raises(CredentialsError, match=r"no Google Cloud project: set gce\.project"):
        provider.non_terminated_nodes()


@pytest.mark.parametrize(
    ("status", "reason", "expected", "says"),
    [
        # On a 401 the client tries to refresh the token; anonymous ones cannot be.
        (401, "authError", CredentialsError, "cannot get a Google access token"),
        (403, "forbidden", CredentialsError, "permission denied: nope"),
        (400, "invalid", ProviderError, "HTTP 400: nope"),
    ],
)
def test_api_refusals_map_to_their_error_class(
    fake_gce: FakeGce, provider: GceProvider, status: int, reason: str,
    expected: type[Exception], says: str,
) -> None:
    fake_gce.fail("instances.aggregatedList", status, reason=reason, message="nope")
    with pytest.raises(expected) as exc:
        provider.non_terminated_nodes()
    assert type(exc.value) is expected
    assert str(exc.value).startswith(f"listing the nodes of tfc-test: {says}")


def test_retry_policy_is_bounded_in_time(
    fake_gce: FakeGce, provider: GceProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        GceProvider, "retry_policy",
        RetryPolicy(attempts=100, initial_s=0.05, max_delay_s=0.05, deadline_s=0.3),
    )
    fake_gce.fail("instances.aggregatedList", 503, times=None)
    started = time.monotonic()
    with pytest.raises(ProviderError, match="gave up"):
        provider.non_terminated_nodes()
    assert time.monotonic() - started < 1.0


# -- host keys from guest attributes ----------------------------------------------------------


@pytest.fixture
def loopback_gce(fake_gce: FakeGce) -> tuple[FakeGce, LoopbackBackend]:
    backend = LoopbackBackend()
    fake_gce.backend = backend  # before any instance exists
    return fake_gce, backend


@pytest.fixture
def loopback_provider(make_provider: MakeProvider) -> Callable[..., GceProvider]:
    def make(port: int, **ssh: Any) -> GceProvider:
        return make_provider(
            ssh={"port": port, "connect_timeout": 5, "boot_timeout": 10, **ssh}
        )

    return make


def test_published_host_keys_are_pinned_per_instance_id_before_the_first_connection(
    loopback_gce: tuple[FakeGce, LoopbackBackend], loopback_provider: Callable[..., GceProvider]
) -> None:
    from infra.transport.host_keys import forget_host
    from infra.transport.ssh import SshTransport

    fake, backend = loopback_gce
    served = paramiko.ECDSAKey.generate()
    backend.published = [key_line(served)]
    with LoopbackSshd(served) as sshd:
        provider = loopback_provider(sshd.port)
        nodes = up(provider, ["pc-1"])
        alias = f"compute.{fake.instance('pc-1')['id']}"
        known = provider.state.known_hosts
        with provider.transport(nodes) as transport:
            assert isinstance(transport, SshTransport)  # GCE's nodes: over SSH
            transport.wait_ready()
            assert f"HostKeyAlias={alias}" in transport.ssh_argv("pc-1")
        assert known.read_text() == f"{alias} {key_line(served)} pc-1\n"
        calls = [c.op for c in fake.calls]
        assert "instances.getGuestAttributes" in calls
        # Stop and start: `deploy.py stop` unpins the old address; the
        # machine's pin stays, and the next connection needs no first use.
        provider.stop_nodes(["pc-1"])
        assert not forget_host(known, "127.0.0.1", sshd.port)
        provider.start_nodes(["pc-1"])
        backend.published = []  # not published again yet after the start
        with provider.transport(provider.non_terminated_nodes()) as transport:
            transport.wait_ready(timeout=5)
        assert known.read_text() == f"{alias} {key_line(served)} pc-1\n"


@pytest.mark.parametrize("same_type", [True, False], ids=["same-type", "other-type"])
def test_a_node_presenting_another_key_than_published_is_refused(
    loopback_gce: tuple[FakeGce, LoopbackBackend],
    loopback_provider: Callable[..., GceProvider],
    same_type: bool,
) -> None:
    fake, backend = loopback_gce
    published = paramiko.ECDSAKey.generate() if same_type else paramiko.RSAKey.generate(2048)
    backend.published = [key_line(published)]
    impostor = paramiko.ECDSAKey.generate()
    with LoopbackSshd(impostor) as sshd:
        provider = loopback_provider(sshd.port)
        nodes = up(provider, ["pc-1"])
        alias = f"compute.{fake.instance('pc-1')['id']}"
        with provider.transport(nodes) as transport, pytest.raises(HostKeyChanged) as caught:
            transport.wait_ready()
    assert caught.value.exit_code == 8
    assert str(caught.value).startswith(f"pc-1: the host key of {alias} is not")
    assert impostor.fingerprint in str(caught.value)
    # The impostor's key was never pinned.
    assert provider.state.known_hosts.read_text() == f"{alias} {key_line(published)} pc-1\n"


def test_keys_published_some_seconds_after_boot_are_waited_for(
    loopback_gce: tuple[FakeGce, LoopbackBackend],
    loopback_provider: Callable[..., GceProvider],
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, backend = loopback_gce
    fake.latency.host_keys = 1.0
    served = paramiko.ECDSAKey.generate()
    backend.published = [key_line(served)]
    with LoopbackSshd(served) as sshd:
        provider = loopback_provider(sshd.port)
        nodes = up(provider, ["pc-1"])
        with caplog.at_level(logging.WARNING, logger="tfcluster"), provider.transport(
            nodes
        ) as transport:
            transport.wait_ready()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    alias = f"compute.{fake.instance('pc-1')['id']}"
    assert provider.state.known_hosts.read_text() == f"{alias} {key_line(served)} pc-1\n"


def test_no_keys_published_within_boot_timeout_falls_back_to_first_use_with_a_warning(
    loopback_gce: tuple[FakeGce, LoopbackBackend],
    loopback_provider: Callable[..., GceProvider],
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, _backend = loopback_gce
    served = paramiko.ECDSAKey.generate()
    with LoopbackSshd(served) as sshd:
        provider = loopback_provider(sshd.port, boot_timeout=1)
        nodes = up(provider, ["pc-1"])
        with caplog.at_level(logging.WARNING, logger="tfcluster"), provider.transport(
            nodes
        ) as transport:
            transport.wait_ready(timeout=10)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "pc-1: no SSH host keys published in its guest attributes after 1 s; trusting the "
        "key it presents now (trust on first use)"
    ]
    # Pinned under the machine's id all the same: it survives stop/start.
    alias = f"compute.{fake.instance('pc-1')['id']}"
    assert provider.state.known_hosts.read_text() == f"{alias} {key_line(served)} pc-1\n"


def test_hostile_guest_attributes_are_not_pinned(
    loopback_gce: tuple[FakeGce, LoopbackBackend], loopback_provider: Callable[..., GceProvider]
) -> None:
    fake, backend = loopback_gce
    backend.published = [
        "ssh-ed25519 not*base64", "x AAAA", "ssh-rsa$(reboot) AAAAAAAAAAAAAAAAAAAA"
    ]
    provider = loopback_provider(22)
    nodes = up(provider, ["pc-1"])
    assert provider.host_keys(nodes[0]) == HostKeys(
        alias=f"compute.{fake.instance('pc-1')['id']}", keys=()
    )


def test_unreadable_published_keys_are_skipped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from infra.transport.host_keys import parse_host_keys

    good = paramiko.ECDSAKey.generate()
    hostile = [
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOXXXX",  # bad padding
        "ssh-rsa QUJDRA==",  # not an RSA key
        "no-such-type AAAAAAAAAAAAAAAAAAAA",
        "x" * 500,
    ]
    with caplog.at_level(logging.WARNING, logger="tfcluster"):
        keys = parse_host_keys("pc-1", [*hostile, key_line(good)])
    assert keys == [good]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4 and all(w.startswith("pc-1: ignoring") for w in warnings)
    assert max(len(w) for w in warnings) < 120  # long node text is cut
