"""The fake Compute Engine API, driven by the real google-cloud-compute client.

If these pass, the provider tests exercise the client library's real
request building, JSON parsing and error mapping against behaviour that
matches GCE's (operations, states, error shapes, fingerprints).
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from tests.fake_gce import Addresses, ApiError, Call, FakeGce, InstanceBackend, Latency
from tests.fake_gce.backend import generated_host_key
from tests.fake_gce.filters import FilterError, compile_filter
from tests.fake_gce.instances import OpQueue

pytest_plugins = ["tests.fake_gce.fixtures"]

PROJECT = "fake-project"
ZONE = "us-central1-a"
DONE = compute_v1.Operation.Status.DONE


class Api:
    """The real clients pointed at the fake."""

    def __init__(self, fake: FakeGce) -> None:
        kwargs: dict[str, Any] = {
            "credentials": AnonymousCredentials(),
            "client_options": ClientOptions(api_endpoint=fake.endpoint),
        }
        self.instances = compute_v1.InstancesClient(**kwargs)
        self.firewalls = compute_v1.FirewallsClient(**kwargs)
        self.zone_ops = compute_v1.ZoneOperationsClient(**kwargs)
        self.global_ops = compute_v1.GlobalOperationsClient(**kwargs)

    def wait(self, op: compute_v1.Operation, zone: str | None = ZONE) -> compute_v1.Operation:
        deadline = time.monotonic() + 10
        while op.status != DONE:
            assert time.monotonic() < deadline, f"operation {op.name} never finished"
            if zone:
                op = self.zone_ops.wait(project=PROJECT, zone=zone, operation=op.name)
            else:
                op = self.global_ops.wait(project=PROJECT, operation=op.name)
        return op

    def insert(self, name: str, zone: str = ZONE, **fields: Any) -> compute_v1.Operation:
        return self.instances.insert_unary(
            project=PROJECT, zone=zone, instance_resource=instance_body(name, zone, **fields)
        )

    def get(self, name: str, zone: str = ZONE) -> compute_v1.Instance:
        return self.instances.get(project=PROJECT, zone=zone, instance=name)


def instance_body(name: str, zone: str = ZONE, **fields: Any) -> compute_v1.Instance:
    body = compute_v1.Instance(
        name=name,
        machine_type=f"zones/{zone}/machineTypes/e2-standard-2",
        labels=fields.pop("labels", {"tfcluster-cluster": "demo"}),
        disks=[
            compute_v1.AttachedDisk(
                boot=True,
                auto_delete=True,
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image="projects/debian-cloud/global/images/family/debian-12",
                    disk_size_gb=20,
                ),
            )
        ],
        network_interfaces=[
            compute_v1.NetworkInterface(
                network="global/networks/default",
                access_configs=[compute_v1.AccessConfig(name="External NAT",
                                                        type_="ONE_TO_ONE_NAT")],
            )
        ],
    )
    for key, value in fields.items():
        setattr(body, key, value)
    return body


@pytest.fixture
def api(fake_gce: FakeGce) -> Api:
    return Api(fake_gce)


def statuses_during(fake: FakeGce, name: str, until: threading.Event) -> list[str]:
    """Every distinct status ``name`` shows until ``until`` is set."""
    seen: list[str] = []
    while True:
        stopping = until.is_set()  # one last look after the caller is done
        try:
            status = fake.instance(name)["status"]
        except KeyError:
            status = "GONE"
        if not seen or seen[-1] != status:
            seen.append(status)
        if stopping:
            return seen
        time.sleep(0.002)


def watch(fake: FakeGce, name: str) -> tuple[threading.Event, list[list[str]]]:
    stop = threading.Event()
    out: list[list[str]] = []
    thread = threading.Thread(target=lambda: out.append(statuses_during(fake, name, stop)))
    thread.start()
    original_set = stop.set

    def finish() -> None:
        original_set()
        thread.join()

    stop.set = finish  # type: ignore[method-assign]
    return stop, out


# -- instances -----------------------------------------------------------------------------


def test_insert_answers_an_operation_and_the_instance_goes_through_its_states(
    fake_gce: FakeGce, api: Api
) -> None:
    fake_gce.latency.provision = 0.15
    fake_gce.latency.staging = 0.15
    op = api.insert("pc-1")
    assert op.status != DONE and op.operation_type == "insert"
    assert op.target_link.endswith(f"/projects/{PROJECT}/zones/{ZONE}/instances/pc-1")
    stop, seen = watch(fake_gce, "pc-1")
    op = api.wait(op)
    # The insert operation is DONE before the instance runs: clients must wait for RUNNING.
    assert api.get("pc-1").status == "STAGING"
    assert op.error.errors == []
    time.sleep(0.3)
    stop.set()
    assert seen[0] == ["PROVISIONING", "STAGING", "RUNNING"]
    inst = api.get("pc-1")
    nic = inst.network_interfaces[0]
    assert ipaddress.ip_address(nic.network_i_p) in ipaddress.ip_network("10.128.0.0/9")
    assert ipaddress.ip_address(nic.access_configs[0].nat_i_p) in ipaddress.ip_network(
        "203.0.113.0/24"
    )
    assert inst.zone.endswith(f"/zones/{ZONE}") and inst.machine_type.endswith("/e2-standard-2")
    assert inst.disks[0].auto_delete and inst.disks[0].boot
    assert inst.network_interfaces[0].network.endswith("/global/networks/default")


def test_one_instance_can_be_slower_to_create_than_the_others(
    fake_gce: FakeGce, api: Api
) -> None:
    fake_gce.latency.provision = 0.02
    fake_gce.latency.per_instance["pc-slow"] = 0.5
    slow = api.insert("pc-slow")
    api.wait(api.insert("pc-fast"))
    assert fake_gce.instance("pc-slow")["status"] == "PROVISIONING"
    api.wait(slow)
    assert fake_gce.instance("pc-slow")["status"] in ("STAGING", "RUNNING")


def test_a_queued_delete_of_an_instance_deleted_meanwhile_fails_not_found(
    fake_gce: FakeGce, api: Api
) -> None:
    # The insert's operation ends at STAGING; the create goes on to RUNNING
    # with the instance's turn held, so both deletes queue behind it, and
    # the first accepted must be the first to run (CI once saw the second
    # win: a plain lock wakes its waiters in any order).
    fake_gce.latency.staging = 0.3
    api.wait(api.insert("pc-1"))
    fake_gce.latency.delete = 0.2
    first = api.instances.delete_unary(project=PROJECT, zone=ZONE, instance="pc-1")
    second = api.instances.delete_unary(project=PROJECT, zone=ZONE, instance="pc-1")
    assert api.wait(first).error.errors == []
    failed = api.wait(second)
    assert failed.error.errors[0].code == "RESOURCE_NOT_FOUND"
    assert failed.http_error_status_code == 404


def test_operations_on_one_instance_run_in_the_order_they_were_accepted() -> None:
    queue = OpQueue()
    closing = threading.Event()
    order: list[int] = []
    held = OpQueue.CREATE  # the insert's, as an instance's first operation
    tickets = [queue.ticket() for _ in range(8)]

    def run(ticket: int) -> None:
        with queue.turn(ticket, closing):
            order.append(ticket)

    threads = [threading.Thread(target=run, args=(t,)) for t in reversed(tickets)]
    with queue.turn(held, closing):
        for thread in threads:
            thread.start()
        time.sleep(0.2)  # all eight waiting
        assert order == []
    for thread in threads:
        thread.join(5)
    assert order == tickets


def test_missing_and_duplicate_instances_answer_404_and_409_in_the_real_error_shape(
    fake_gce: FakeGce, api: Api
) -> None:
    with pytest.raises(api_exceptions.NotFound) as missing:
        api.get("nope")
    assert missing.value.errors[0]["reason"] == "notFound"
    api.wait(api.insert("pc-1"))
    with pytest.raises(api_exceptions.Conflict) as dup:
        api.insert("pc-1")
    assert "already exists" in dup.value.errors[0]["message"]
    path = f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/x"
    raw = requests.get(fake_gce.endpoint + path)
    assert raw.status_code == 404
    error = raw.json()["error"]
    assert error["code"] == 404 and error["errors"][0]["reason"] == "notFound"
    assert "instances/x' was not found" in error["message"]
    # A zone the API does not know is a 400, not a missing resource (issue 26).
    with pytest.raises(api_exceptions.BadRequest) as unknown:
        api.instances.get(project=PROJECT, zone="mars-north1-a", instance="pc-1")
    assert unknown.value.errors[0] == {
        "message": "Invalid value for field 'zone': 'mars-north1-a'. Unknown zone.",
        "domain": "global",
        "reason": "invalid",
    }


def test_invalid_instances_are_refused_as_gce_refuses_them(fake_gce: FakeGce, api: Api) -> None:
    with pytest.raises(api_exceptions.BadRequest, match="live migration"):
        api.insert(
            "gpu",
            machine_type=f"zones/{ZONE}/machineTypes/n1-standard-4",
            guest_accelerators=[
                compute_v1.AcceleratorConfig(
                    accelerator_type="nvidia-tesla-t4", accelerator_count=1
                )
            ],
        )
    with pytest.raises(api_exceptions.BadRequest, match="automatic restart"):
        api.insert(
            "spot", scheduling=compute_v1.Scheduling(provisioning_model="SPOT",
                                                     automatic_restart=True)
        )
    with pytest.raises(api_exceptions.BadRequest, match="labels"):
        api.insert("badlabel", labels={"Team": "x"})
    with pytest.raises(api_exceptions.BadRequest, match=r"resource\.name"):
        api.insert("Bad_Name")
    assert fake_gce.instances() == []


def test_list_filters_by_label_and_pages(fake_gce: FakeGce, api: Api) -> None:
    for name in ("a-1", "a-2", "a-3"):
        api.insert(name, labels={"tfcluster-cluster": "alpha"})
    api.insert("b-1", labels={"tfcluster-cluster": "beta"})
    api.insert("c-1", zone="us-central1-b", labels={"tfcluster-cluster": "alpha"})
    fake_gce.wait_quiet()
    request = compute_v1.ListInstancesRequest(
        project=PROJECT, zone=ZONE, filter='labels.tfcluster-cluster = "alpha"', max_results=2
    )
    names = [i.name for i in api.instances.list(request=request)]
    assert names == ["a-1", "a-2", "a-3"]
    assert [c.query.get("pageToken") is not None for c in fake_gce.calls
            if c.op == "instances.list"] == [False, True]
    aggregated = api.instances.aggregated_list(
        request=compute_v1.AggregatedListInstancesRequest(
            project=PROJECT, filter="labels.tfcluster-cluster = alpha"
        )
    )
    found = {(scope, i.name) for scope, scoped in aggregated for i in scoped.instances}
    assert found == {
        ("zones/us-central1-a", "a-1"),
        ("zones/us-central1-a", "a-2"),
        ("zones/us-central1-a", "a-3"),
        ("zones/us-central1-b", "c-1"),
    }
    with pytest.raises(api_exceptions.BadRequest, match="filter"):
        list(api.instances.list(request=compute_v1.ListInstancesRequest(
            project=PROJECT, zone=ZONE, filter="labels.x = a AND b = c OR d = e")))


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('labels.env = "prod"', True),
        ("labels.env = prod", True),
        ("labels.env != prod", False),
        ("labels.env = dev", False),
        ("labels.missing = prod", False),
        ("labels.missing != prod", True),
        ("name eq pc-[0-9]+", True),
        ("name ne pc-.*", False),
        ("labels.env:*", True),
        ("labels.nope:*", False),
        ("(labels.env = prod) (name = pc-1)", True),
        ("labels.env = prod AND name = pc-2", False),
        ("labels.env = dev OR name = pc-1", True),
        ("NOT labels.env = dev", True),
        ("scheduling.preemptible = false", True),
    ],
)
def test_filter_expressions(expression: str, expected: bool) -> None:
    resource = {"name": "pc-1", "labels": {"env": "prod"}, "scheduling": {"preemptible": False}}
    assert compile_filter(expression)(resource) is expected


@pytest.mark.parametrize(
    "expression", ["labels.env", "a = b AND c = d OR e = f", "(a = b", "= b", "a ~ b"]
)
def test_filters_the_fake_does_not_understand_are_errors(expression: str) -> None:
    with pytest.raises(FilterError):
        compile_filter(expression)


def test_stop_and_start_keep_the_internal_ip_and_change_the_external_one(
    fake_gce: FakeGce, api: Api
) -> None:
    api.wait(api.insert("pc-1"))
    fake_gce.wait_quiet()
    time.sleep(0.05)
    before = api.get("pc-1").network_interfaces[0]
    fake_gce.latency.stop = 0.15
    stop, seen = watch(fake_gce, "pc-1")
    op = api.wait(api.instances.stop_unary(project=PROJECT, zone=ZONE, instance="pc-1"))
    stop.set()
    assert op.operation_type == "stop"
    assert seen[0][-2:] == ["STOPPING", "TERMINATED"]
    stopped = api.get("pc-1").network_interfaces[0]
    assert stopped.access_configs[0].nat_i_p == ""
    # stopping a stopped instance is fine
    api.wait(api.instances.stop_unary(project=PROJECT, zone=ZONE, instance="pc-1"))
    api.wait(api.instances.start_unary(project=PROJECT, zone=ZONE, instance="pc-1"))
    after = api.get("pc-1")
    assert after.status == "RUNNING"
    assert after.network_interfaces[0].network_i_p == before.network_i_p
    assert after.network_interfaces[0].access_configs[0].nat_i_p not in (
        "", before.access_configs[0].nat_i_p
    )


def test_start_while_stopping_is_not_ready(fake_gce: FakeGce, api: Api) -> None:
    api.wait(api.insert("pc-1"))
    fake_gce.latency.stop = 0.3
    api.instances.stop_unary(project=PROJECT, zone=ZONE, instance="pc-1")
    time.sleep(0.1)
    with pytest.raises(api_exceptions.BadRequest) as exc:
        api.instances.start_unary(project=PROJECT, zone=ZONE, instance="pc-1")
    assert exc.value.errors[0]["reason"] == "resourceNotReady"


def test_delete_passes_through_stopping_and_then_404(fake_gce: FakeGce, api: Api) -> None:
    api.wait(api.insert("pc-1"))
    fake_gce.latency.delete = 0.1
    op = api.instances.delete_unary(project=PROJECT, zone=ZONE, instance="pc-1")
    time.sleep(0.03)
    assert api.get("pc-1").status == "STOPPING"
    api.wait(op)
    with pytest.raises(api_exceptions.NotFound):
        api.get("pc-1")
    with pytest.raises(api_exceptions.NotFound):
        api.instances.delete_unary(project=PROJECT, zone=ZONE, instance="pc-1")


def test_stockout_fails_the_operation_and_the_instance_vanishes(
    fake_gce: FakeGce, api: Api
) -> None:
    fake_gce.stockout(ZONE, code="ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")
    op = api.wait(api.insert("pc-1"))
    assert op.status == DONE
    assert op.http_error_status_code == 503
    error = op.error.errors[0]
    assert error.code == "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
    assert f"projects/{PROJECT}/zones/{ZONE}" in error.message
    assert fake_gce.instances() == []
    # another zone is fine
    other = "us-central1-b"
    assert api.wait(api.insert("pc-1", zone=other), zone=other).error.errors == []


def test_partial_stockout_and_a_half_created_leftover(fake_gce: FakeGce, api: Api) -> None:
    fake_gce.stockout(ZONE, after=1, leave_instance=True)
    first = api.wait(api.insert("pc-1"))
    second = api.wait(api.insert("pc-2"))
    assert first.error.errors == []
    assert second.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert api.get("pc-2").status == "TERMINATED"


def test_quota_in_the_operation_or_as_a_403(fake_gce: FakeGce, api: Api) -> None:
    fake_gce.quota_exceeded(ZONE)
    op = api.wait(api.insert("pc-1"))
    assert op.error.errors[0].code == "QUOTA_EXCEEDED"
    assert op.http_error_status_code == 403
    assert "Quota 'CPUS' exceeded" in op.error.errors[0].message
    fake_gce.clear_faults()
    fake_gce.quota_exceeded("us-central1-b", http=True, metric="GPUS_ALL_REGIONS")
    with pytest.raises(api_exceptions.Forbidden) as exc:
        api.insert("pc-1", zone="us-central1-b")
    assert exc.value.errors[0]["reason"] == "quotaExceeded"


def test_http_faults_count_down_and_are_logged(fake_gce: FakeGce, api: Api) -> None:
    fake_gce.fail("instances.get", 503, times=2)
    api.wait(api.insert("pc-1"))
    for _ in range(2):
        with pytest.raises(api_exceptions.ServiceUnavailable):
            # retry=None: the client's own default retry would hide the 503s
            api.instances.get(project=PROJECT, zone=ZONE, instance="pc-1", retry=None)
    assert api.get("pc-1").name == "pc-1"
    gets = [c.status for c in fake_gce.calls if c.op == "instances.get"]
    assert gets == [503, 503, 200]
    fake_gce.fail("instances.delete", 404, name="pc-9")
    with pytest.raises(api_exceptions.NotFound):
        api.instances.delete_unary(project=PROJECT, zone=ZONE, instance="pc-9")


def test_call_log_tells_mutating_calls_from_reads(fake_gce: FakeGce, api: Api) -> None:
    api.wait(api.insert("pc-1"))
    api.get("pc-1")
    list(api.instances.list(project=PROJECT, zone=ZONE))
    mutating = fake_gce.mutating_calls()
    assert [c.op for c in mutating] == ["instances.insert"]
    assert mutating[0].name == "pc-1" and mutating[0].zone == ZONE
    assert mutating[0].body["machineType"] == f"zones/{ZONE}/machineTypes/e2-standard-2"
    assert {"zoneOperations.wait", "instances.get", "instances.list"} <= set(fake_gce.ops_called())


def test_preempt_terminates_like_gce(fake_gce: FakeGce, api: Api) -> None:
    api.wait(
        api.insert(
            "spot",
            scheduling=compute_v1.Scheduling(
                provisioning_model="SPOT", automatic_restart=False,
                instance_termination_action="STOP",
            ),
        )
    )
    fake_gce.wait_quiet()
    time.sleep(0.05)
    fake_gce.preempt("spot")
    inst = api.get("spot")
    assert inst.status == "TERMINATED"
    assert inst.network_interfaces[0].access_configs[0].nat_i_p == ""
    assert inst.scheduling.on_host_maintenance == "TERMINATE"  # GCE's default for Spot
    assert any(o["operationType"] == "compute.instances.preempted" for o in fake_gce.operations())


def test_label_and_metadata_fingerprints(fake_gce: FakeGce, api: Api) -> None:
    api.wait(api.insert("pc-1"))
    inst = api.get("pc-1")
    with pytest.raises(api_exceptions.PreconditionFailed):
        api.instances.set_labels_unary(
            project=PROJECT, zone=ZONE, instance="pc-1",
            instances_set_labels_request_resource=compute_v1.InstancesSetLabelsRequest(
                labels={"a": "b"}, label_fingerprint="stale"
            ),
        )
    api.wait(
        api.instances.set_labels_unary(
            project=PROJECT, zone=ZONE, instance="pc-1",
            instances_set_labels_request_resource=compute_v1.InstancesSetLabelsRequest(
                labels={"a": "b"}, label_fingerprint=inst.label_fingerprint
            ),
        )
    )
    updated = api.get("pc-1")
    assert dict(updated.labels) == {"a": "b"}
    assert updated.label_fingerprint != inst.label_fingerprint
    metadata = compute_v1.Metadata(
        fingerprint=updated.metadata.fingerprint,
        items=[compute_v1.Items(key="ssh-keys", value="me:ssh-ed25519 AAAA me")],
    )
    api.wait(api.instances.set_metadata_unary(
        project=PROJECT, zone=ZONE, instance="pc-1", metadata_resource=metadata))
    with pytest.raises(api_exceptions.PreconditionFailed):
        api.instances.set_metadata_unary(
            project=PROJECT, zone=ZONE, instance="pc-1", metadata_resource=metadata
        )
    assert {i.key: i.value for i in api.get("pc-1").metadata.items} == {
        "ssh-keys": "me:ssh-ed25519 AAAA me"
    }


def test_bulk_insert_creates_all_or_nothing(fake_gce: FakeGce, api: Api) -> None:
    props = compute_v1.InstanceProperties(
        machine_type="e2-standard-2",
        labels={"tfcluster-cluster": "bulk"},
        disks=instance_body("x").disks,
        network_interfaces=instance_body("x").network_interfaces,
    )
    op = api.instances.bulk_insert_unary(
        project=PROJECT, zone=ZONE,
        bulk_insert_instance_resource_resource=compute_v1.BulkInsertInstanceResource(
            count=3, min_count=3, name_pattern="node-##", instance_properties=props
        ),
    )
    assert op.operation_type == "bulkInsert"
    assert api.wait(op).error.errors == []
    assert [i["name"] for i in fake_gce.instances()] == ["node-01", "node-02", "node-03"]
    assert all(i["machineType"].endswith("/machineTypes/e2-standard-2")
               for i in fake_gce.instances())
    fake_gce.stockout("us-central1-b")
    failed = api.wait(
        api.instances.bulk_insert_unary(
            project=PROJECT, zone="us-central1-b",
            bulk_insert_instance_resource_resource=compute_v1.BulkInsertInstanceResource(
                count=2, min_count=2, instance_properties=props,
                per_instance_properties={
                    "w-1": compute_v1.BulkInsertInstanceResourcePerInstanceProperties(),
                    "w-2": compute_v1.BulkInsertInstanceResourcePerInstanceProperties(),
                },
            ),
        ),
        zone="us-central1-b",
    )
    assert failed.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert [i["name"] for i in fake_gce.instances()] == ["node-01", "node-02", "node-03"]


def test_operation_wait_blocks_until_done_or_its_limit(fake_gce: FakeGce, api: Api) -> None:
    fake_gce.latency.provision = 2.0
    fake_gce.wait_max_s = 0.2
    op = api.insert("slow")
    started = time.monotonic()
    waited = api.zone_ops.wait(project=PROJECT, zone=ZONE, operation=op.name)
    assert waited.status != DONE
    assert 0.15 < time.monotonic() - started < 1.5
    got = api.zone_ops.get(project=PROJECT, zone=ZONE, operation=op.name)
    assert got.name == op.name
    with pytest.raises(api_exceptions.NotFound):
        api.zone_ops.get(project=PROJECT, zone=ZONE, operation="operation-nope")


# -- firewalls -----------------------------------------------------------------------------


def test_firewall_lifecycle(fake_gce: FakeGce, api: Api) -> None:
    rule = compute_v1.Firewall(
        name="fw-1", network="global/networks/default", direction="INGRESS",
        allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["2222", "2223"])],
        source_tags=["t"], target_tags=["t"],
    )
    op = api.firewalls.insert_unary(project=PROJECT, firewall_resource=rule)
    assert op.zone == "" and "/global/operations/" in op.self_link
    api.wait(op, zone=None)
    got = api.firewalls.get(project=PROJECT, firewall="fw-1")
    assert list(got.source_ranges) == []  # source tags given: no default range
    assert [list(a.ports) for a in got.allowed] == [["2222", "2223"]]
    with pytest.raises(api_exceptions.Conflict):
        api.firewalls.insert_unary(project=PROJECT, firewall_resource=rule)
    # No source at all: GCE opens the rule to 0.0.0.0/0.
    open_rule = compute_v1.Firewall(
        name="fw-open", allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])]
    )
    api.wait(api.firewalls.insert_unary(project=PROJECT, firewall_resource=open_rule), None)
    assert list(api.firewalls.get(project=PROJECT, firewall="fw-open").source_ranges) == [
        "0.0.0.0/0"
    ]
    names = [f.name for f in api.firewalls.list(
        request=compute_v1.ListFirewallsRequest(project=PROJECT, filter="name = fw-1"))]
    assert names == ["fw-1"]
    # update replaces the rule, patch merges into it
    replaced = compute_v1.Firewall(
        name="fw-1", allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["9"])],
        source_ranges=["10.0.0.0/8"],
    )
    api.wait(api.firewalls.update_unary(project=PROJECT, firewall="fw-1",
                                        firewall_resource=replaced), None)
    got = api.firewalls.get(project=PROJECT, firewall="fw-1")
    assert list(got.source_tags) == [] and list(got.source_ranges) == ["10.0.0.0/8"]
    api.wait(api.firewalls.patch_unary(
        project=PROJECT, firewall="fw-1",
        firewall_resource=compute_v1.Firewall(target_tags=["x"])), None)
    got = api.firewalls.get(project=PROJECT, firewall="fw-1")
    assert list(got.target_tags) == ["x"] and list(got.source_ranges) == ["10.0.0.0/8"]
    api.wait(api.firewalls.delete_unary(project=PROJECT, firewall="fw-1"), None)
    with pytest.raises(api_exceptions.NotFound):
        api.firewalls.get(project=PROJECT, firewall="fw-1")
    with pytest.raises(api_exceptions.NotFound):
        api.firewalls.delete_unary(project=PROJECT, firewall="fw-1")


def test_firewall_rules_the_real_api_refuses_are_refused(fake_gce: FakeGce, api: Api) -> None:
    tcp = [compute_v1.Allowed(I_p_protocol="tcp", ports=["2222"])]
    both = compute_v1.Firewall(
        name="fw-both", allowed=tcp, denied=[compute_v1.Denied(I_p_protocol="tcp")],
        source_ranges=["0.0.0.0/0"],
    )
    with pytest.raises(api_exceptions.BadRequest, match="only one of 'allowed' or 'denied'"):
        api.firewalls.insert_unary(project=PROJECT, firewall_resource=both)
    for priority in (-1, 65536):
        bad = compute_v1.Firewall(name="fw-prio", allowed=tcp, priority=priority)
        with pytest.raises(api_exceptions.BadRequest, match=r"resource\.priority"):
            api.firewalls.insert_unary(project=PROJECT, firewall_resource=bad)
    deny = compute_v1.Firewall(
        name="fw-deny", denied=[compute_v1.Denied(I_p_protocol="tcp", ports=["2222"])],
        source_ranges=["0.0.0.0/0"], target_tags=["t"], priority=65535,
    )
    api.wait(api.firewalls.insert_unary(project=PROJECT, firewall_resource=deny), None)
    got = api.firewalls.get(project=PROJECT, firewall="fw-deny")
    assert got.priority == 65535 and [list(d.ports) for d in got.denied] == [["2222"]]
    assert list(got.allowed) == []
    assert fake_gce.firewall("fw-both") is None and fake_gce.firewall("fw-prio") is None
    # A firewall rule has no labels (the client's type has no such field):
    # GCE refuses a body that names one, so a cluster marks its rules in
    # their description instead.
    path = f"/compute/v1/projects/{PROJECT}/global/firewalls"
    labelled: dict[str, Any] = {
        "name": "fw-labels", "allowed": [{"IPProtocol": "tcp"}], "labels": {"a": "b"}
    }
    raw = requests.post(fake_gce.endpoint + path, json=labelled)
    assert raw.status_code == 400
    assert 'Unknown name "labels"' in raw.json()["error"]["message"]
    assert fake_gce.firewall("fw-labels") is None


def test_guest_attributes_publish_host_keys_of_running_instances_that_enable_them(
    fake_gce: FakeGce, api: Api
) -> None:
    def host_keys(name: str) -> list[tuple[str, str, str]]:
        request = compute_v1.GetGuestAttributesInstanceRequest(
            project=PROJECT, zone=ZONE, instance=name, query_path="hostkeys/"
        )
        found = api.instances.get_guest_attributes(request=request)
        return [(i.namespace, i.key, i.value) for i in found.query_value.items]

    enabled = compute_v1.Metadata(
        items=[compute_v1.Items(key="enable-guest-attributes", value="TRUE")]
    )
    def running(name: str) -> None:
        deadline = time.monotonic() + 5
        while fake_gce.instance(name)["status"] != "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.01)

    api.wait(api.insert("vm-on", metadata=enabled))
    api.wait(api.insert("vm-off"))
    running("vm-on")
    running("vm-off")
    with pytest.raises(api_exceptions.NotFound):
        host_keys("vm-off")  # guest attributes not enabled: nothing published
    instance_id = fake_gce.instance("vm-on")["id"]
    _, public = generated_host_key(instance_id)
    key_type, blob = public.split()[:2]
    assert host_keys("vm-on") == [("hostkeys", key_type, blob)]
    fake_gce.set_guest_attribute("vm-on", "hostkeys/ecdsa-sha2-nistp256", "AAAAE2Vj")
    assert ("hostkeys", "ecdsa-sha2-nistp256", "AAAAE2Vj") in host_keys("vm-on")
    # Stopped: nothing; started again: the same key (the disk keeps /etc/ssh).
    api.wait(api.instances.stop_unary(project=PROJECT, zone=ZONE, instance="vm-on"))
    fake_gce.wait_quiet()
    with pytest.raises(api_exceptions.NotFound):
        host_keys("vm-on")
    fake_gce.latency.host_keys = 0.5  # the guest agent publishes a while after boot
    api.wait(api.instances.start_unary(project=PROJECT, zone=ZONE, instance="vm-on"))
    running("vm-on")
    with pytest.raises(api_exceptions.NotFound):
        host_keys("vm-on")
    time.sleep(0.6)
    assert ("hostkeys", key_type, blob) in host_keys("vm-on")
    with pytest.raises(api_exceptions.BadRequest):
        api.instances.get_guest_attributes(
            request=compute_v1.GetGuestAttributesInstanceRequest(
                project=PROJECT, zone=ZONE, instance="vm-on", query_path="../x"
            )
        )


# -- hooks and backends --------------------------------------------------------------------


class RecordingBackend(InstanceBackend):
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.starts = 0
        self.closed = False

    def on_create(self, instance: dict[str, Any]) -> Addresses:
        self.events.append(("create", instance["name"]))
        assert instance["status"] == "PROVISIONING"
        return Addresses(network_ip="172.30.0.11", nat_ip="172.30.0.11")

    def on_start(self, instance: dict[str, Any]) -> Addresses:
        self.starts += 1
        self.events.append(("start", instance["name"]))
        return Addresses(network_ip=f"172.30.0.{20 + self.starts}")

    def on_stop(self, instance: dict[str, Any]) -> None:
        self.events.append(("stop", instance["name"]))

    def on_delete(self, instance: dict[str, Any]) -> None:
        self.events.append(("delete", instance["name"]))

    def on_metadata(self, instance: dict[str, Any]) -> None:
        keys = {i["key"]: i["value"] for i in instance["metadata"]["items"]}
        self.events.append(("metadata", keys.get("ssh-keys", "")))

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def backend_fake() -> Iterator[tuple[FakeGce, RecordingBackend]]:
    backend = RecordingBackend()
    fake = FakeGce(latency=Latency(provision=0.01), backend=backend, wait_max_s=0.5)
    with fake:
        yield fake, backend
    assert backend.closed


def test_backend_hooks_decide_addresses_and_see_every_transition(
    backend_fake: tuple[FakeGce, RecordingBackend],
) -> None:
    fake, backend = backend_fake
    api = Api(fake)
    api.wait(api.insert("pc-1"))
    nic = api.get("pc-1").network_interfaces[0]
    assert (nic.network_i_p, nic.access_configs[0].nat_i_p) == ("172.30.0.11", "172.30.0.11")
    api.wait(api.instances.stop_unary(project=PROJECT, zone=ZONE, instance="pc-1"))
    api.wait(api.instances.start_unary(project=PROJECT, zone=ZONE, instance="pc-1"))
    nic = api.get("pc-1").network_interfaces[0]
    assert nic.network_i_p == "172.30.0.21"
    assert nic.access_configs[0].nat_i_p.startswith("203.0.113.")  # backend left it to the fake
    inst = api.get("pc-1")
    api.wait(api.instances.set_metadata_unary(
        project=PROJECT, zone=ZONE, instance="pc-1",
        metadata_resource=compute_v1.Metadata(
            fingerprint=inst.metadata.fingerprint,
            items=[compute_v1.Items(key="ssh-keys", value="u:key")],
        ),
    ))
    api.wait(api.instances.delete_unary(project=PROJECT, zone=ZONE, instance="pc-1"))
    assert backend.events == [
        ("create", "pc-1"), ("stop", "pc-1"), ("start", "pc-1"), ("metadata", "u:key"),
        ("delete", "pc-1"),
    ]


def test_a_failing_backend_fails_the_operation_and_is_recorded() -> None:
    class Broken(InstanceBackend):
        def on_create(self, instance: dict[str, Any]) -> Addresses:
            raise RuntimeError("docker said no")

    with FakeGce(backend=Broken(), wait_max_s=0.5) as fake:
        api = Api(fake)
        op = api.wait(api.insert("pc-1"))
        assert op.error.errors[0].code == "INTERNAL_ERROR"
        assert "docker said no" in op.error.errors[0].message
        assert [str(e) for e in fake.internal_errors] == ["docker said no"]


def test_hooks_run_before_the_call_and_may_answer_it(fake_gce: FakeGce, api: Api) -> None:
    seen: list[Call] = []
    fake_gce.hook("instances.insert", seen.append, name="pc-2", times=None)

    def refuse(call: Call) -> None:
        raise ApiError(429, "Rate Limit Exceeded", "rateLimitExceeded")

    fake_gce.hook("instances.get", refuse)
    api.wait(api.insert("pc-1"))
    api.wait(api.insert("pc-2"))
    assert [c.name for c in seen] == ["pc-2"]
    with pytest.raises(api_exceptions.TooManyRequests):
        api.get("pc-1")
    assert api.get("pc-1").name == "pc-1"  # times=1


def test_request_id_makes_a_retried_insert_idempotent(fake_gce: FakeGce, api: Api) -> None:
    request = compute_v1.InsertInstanceRequest(
        project=PROJECT, zone=ZONE, instance_resource=instance_body("pc-1"),
        request_id="6f1f5f4e-0000-4000-8000-000000000001",
    )
    first = api.instances.insert_unary(request=request)
    second = api.instances.insert_unary(request=request)
    assert first.name == second.name
    assert len(fake_gce.instances()) == 1


def test_the_fake_stops_cleanly_with_operations_in_flight() -> None:
    fake = FakeGce(latency=Latency(provision=30.0)).start()
    api = Api(fake)
    api.insert("pc-1")
    started = time.monotonic()
    fake.stop()
    assert time.monotonic() - started < 3
    assert not fake.internal_errors
