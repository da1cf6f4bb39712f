"""Issue 26: the GPU and error answers of real Compute Engine that
tfcluster misread, each modelled by the fake GCE in GCE's own words
(tests/fake_gce/catalog.py and server.py say where each was seen) and
read right by the provider: a GPU not offered in a zone and a stockout
answered at once move to the next zone, a node with Local SSD is stopped
with discardLocalSsd, A3 Ultra carries H200s, an unknown zone is a
cluster.yaml mistake (`up --skip-setup` asking no node: test_gce_up_waits.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from infra.config.loader import ClusterConfig
from infra.errors import CapacityError, ConfigError, ProviderError
from infra.providers.base import NodeState
from infra.providers.gce import GceProvider
from infra.providers.gce import checks as gce_checks
from infra.providers.gce import errors as gce_errors
from infra.providers.gce.pricing import table as pricing
from infra.state.folder import ClusterState
from tests.fake_gce import FakeGce
from tests.fake_gce import catalog as fake_catalog

pytest_plugins = ["tests.fake_gce.fixtures"]

ZONE_A, ZONE_B = "us-central1-a", "us-central1-b"
DLVM = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11"
MakeProvider = Callable[..., GceProvider]


@pytest.fixture
def make_provider(gce_config: Callable[..., ClusterConfig]) -> MakeProvider:
    def make(**overrides: Any) -> GceProvider:
        config = gce_config(**{"nodes": ["pc-1", "pc-2"], "roles": {
            "ps": "pc-1", "chief": "pc-1", "worker": ["pc-2"]}, **overrides})
        return GceProvider(config, ClusterState(config.name))

    return make


def up(provider: GceProvider) -> None:
    provider.prepare()
    provider.create_nodes(provider.config.nodes)


def calls(fake: FakeGce, op: str, zone: str | None = None) -> list[Any]:
    return [c for c in fake.calls if c.op == op and (zone is None or c.zone == zone)]


# -- 1. a GPU type not offered in a zone --------------------------------------------------


def test_a_gpu_the_first_zone_does_not_offer_moves_the_batch_to_the_next(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    # us-central1-b has no P4: GCE answers 400 "The resource '.../acceleratorTypes/
    # nvidia-tesla-p4' was not found", which once stopped `up` there.
    assert "nvidia-tesla-p4" not in fake_catalog.ACCELERATOR_TYPES[ZONE_B]
    provider = make_provider(gce={
        "zones": [ZONE_B, ZONE_A], "machine_type": "n1-standard-4", "image": DLVM,
        "accelerator": {"type": "nvidia-tesla-p4", "count": 1},
    })
    up(provider)
    nodes = provider.non_terminated_nodes()
    assert [(n.zone, n.accelerators) for n in nodes] == [(ZONE_A, "1 x nvidia-tesla-p4")] * 2
    assert {c.status for c in calls(fake_gce, "instances.insert", ZONE_B)} == {400}


def test_only_this_zones_missing_type_is_a_reason_to_move_on() -> None:
    gpu = "The resource 'projects/p/zones/us-central1-b/acceleratorTypes/nvidia-tesla-p4' was "
    assert gce_errors.not_in_zone(gpu + "not found", "us-central1-b")
    assert not gce_errors.not_in_zone(gpu + "not found", "us-central1-a")
    subnet = "The resource 'projects/p/regions/us-central1/subnetworks/x' was not found"
    assert not gce_errors.not_in_zone(subnet, "us-central1-b")


# -- 2. Local SSD on stop ----------------------------------------------------------------


def stop_queries(fake: FakeGce) -> dict[str, str | None]:
    return {c.name: c.query.get("discardLocalSsd") for c in calls(fake, "instances.stop")}


def test_a2_ultra_nodes_are_stopped_keeping_their_local_ssd_by_default(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    provider = make_provider(gce={"machine_type": "a2-ultragpu-1g", "image": DLVM})
    up(provider)
    provider.stop_nodes(provider.config.nodes)  # GCE refuses a stop that does not say
    assert stop_queries(fake_gce) == {"pc-1": "false", "pc-2": "false"}
    fake_gce.wait_quiet()
    for inst in fake_gce.instances():
        assert inst["status"] == "TERMINATED"
        assert [d.get("savedState") for d in inst["disks"] if d["type"] == "SCRATCH"] == [
            "PRESERVED"
        ]
    assert {n.state for n in provider.non_terminated_nodes()} == {NodeState.STOPPED}


def test_local_ssd_on_stop_discard_says_so_and_other_types_are_not_asked(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    provider = make_provider(gce={
        "machine_type": "a3-highgpu-8g", "image": DLVM, "disk_type": "pd-balanced",
        "local_ssd_on_stop": "discard",
    })
    up(provider)
    provider.stop_nodes(["pc-1"])
    assert stop_queries(fake_gce) == {"pc-1": "true"}
    plain = make_provider(name="plain", gce={"zones": [ZONE_B]})
    up(plain)
    fake_gce.reset_calls()
    plain.stop_nodes(plain.config.nodes)
    assert stop_queries(fake_gce) == {"pc-1": None, "pc-2": None}


def test_a_refused_keep_says_which_key_to_change(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    provider = make_provider(gce={"machine_type": "a2-ultragpu-1g", "image": DLVM})
    up(provider)
    fake_gce.fail("instances.stop", 400, times=None, reason="badRequest",
                  message="Preserving Local SSD data is not supported for this VM.")
    with pytest.raises(ProviderError) as refused:
        provider.stop_nodes(["pc-1"])
    assert "GCE refused to stop pc-1 keeping its Local SSD data" in str(refused.value)
    assert refused.value.hint and "gce.local_ssd_on_stop: discard" in refused.value.hint


def test_local_ssd_on_stop_is_keep_or_discard(gce_config: Callable[..., ClusterConfig]) -> None:
    with pytest.raises(ConfigError) as wrong:
        gce_config(gce={"local_ssd_on_stop": "drop"})
    assert str(wrong.value) == (
        "<test>: gce.local_ssd_on_stop: 'drop' is not allowed; input should be 'keep' or "
        "'discard'"
    )
    with pytest.raises(ConfigError, match=r"gce\.local_ssd_on_stop"):
        gce_config(gce={"local_ssd_on_stop": False})


def test_machine_types_that_come_with_local_ssd() -> None:
    for machine in ("a2-ultragpu-1g", "a3-highgpu-8g", "a3-megagpu-8g", "a3-ultragpu-8g",
                    "c3-standard-8-lssd"):
        assert gce_checks.bundles_local_ssd(machine), machine
    for machine in ("a2-highgpu-1g", "g2-standard-4", "n1-standard-4", "c3-standard-8"):
        assert not gce_checks.bundles_local_ssd(machine), machine
    # The fake's table (from GCE's pages) agrees.
    assert all(gce_checks.bundles_local_ssd(m) for m in fake_catalog.LOCAL_SSD_DISKS)


# -- 3. A3 Ultra carries H200s ---------------------------------------------------------------


def test_a3_ultra_has_eight_h200s_where_it_is_shown_and_counted(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    assert gce_checks.builtin_gpus("a3-ultragpu-8g") == ("nvidia-h200-141gb", 8)
    assert gce_checks.builtin_gpus("a3-megagpu-8g") == ("nvidia-h100-mega-80gb", 8)
    assert gce_checks.builtin_gpus("a3-edgegpu-8g") == ("nvidia-h100-80gb", 8)
    # Every built-in type the fake offers: the provider names the same GPUs.
    for machine, gpus in fake_catalog.BUILTIN_GPUS.items():
        assert gce_checks.builtin_gpus(machine) == gpus, machine
    provider = make_provider(gce={
        "machine_type": "a3-ultragpu-8g", "image": DLVM, "disk_type": "pd-balanced",
    })
    assert provider.gpus_per_node(provider.config) == 8
    assert provider.planned_node() == (
        "a3-ultragpu-8g, 8 x nvidia-h200-141gb built in, 20 GB pd-balanced, zone "
        "us-central1-a, else us-central1-b"
    )
    # No list price is recorded for A3 or the H200: the estimate says so
    # rather than pricing H200s as H100s.
    assert provider.planned_cost(2) is None
    assert pricing.gpu_hourly("nvidia-h200-141gb") is None


def test_a_planned_g2_node_costs_its_built_in_gpu(make_provider: MakeProvider) -> None:
    provider = make_provider(gce={
        "machine_type": "g2-standard-4", "image": DLVM, "disk_type": "pd-balanced",
    })
    with_gpu = pricing.node_hourly(
        "g2-standard-4", running=True, accelerators=[("nvidia-l4", 1)], disk_gb=20,
        disk_type="pd-balanced", zone=ZONE_A,
    ).usd_per_hour
    assert with_gpu is not None
    assert provider.planned_cost(2) == pytest.approx(2 * with_gpu)


def test_a_stopped_node_keeping_local_ssd_says_the_estimate_leaves_it_out(
    fake_gce: FakeGce, make_provider: MakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    provider = make_provider(gce={"machine_type": "a2-ultragpu-1g", "image": DLVM})
    up(provider)
    provider.stop_nodes(provider.config.nodes)
    with caplog.at_level(logging.WARNING, logger="tfcluster"):
        provider.hourly_cost(provider.non_terminated_nodes())
    assert [r.getMessage() for r in caplog.records] == [
        "cost estimate: the Local SSD data a stopped a2-ultragpu-1g keeps "
        "(gce.local_ssd_on_stop: keep) is billed and not in the estimate"
    ]


# -- 4. a stockout answered at once as HTTP 503 --------------------------------------------


def test_a_stockout_answered_as_http_503_moves_on_without_retrying(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    fake_gce.stockout(ZONE_A, http=True)
    provider = make_provider()
    up(provider)
    assert {n.zone for n in provider.non_terminated_nodes()} == {ZONE_B}
    # Once per node: a stockout is not worth another try in the same zone.
    assert sorted(c.name for c in calls(fake_gce, "instances.insert", ZONE_A)) == [
        "pc-1", "pc-2"
    ]


def test_a_stockout_503_on_start_is_a_capacity_error(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    provider = make_provider()
    up(provider)
    provider.stop_nodes(["pc-1"])
    fake_gce.fail(
        "instances.start", 503, times=None,
        message=f"The zone 'projects/fake-project/zones/{ZONE_A}' does not have enough "
        "resources available to fulfill the request.  Try a different zone, or try again later.",
    )
    with pytest.raises(CapacityError) as full:
        provider.start_nodes(["pc-1"])
    assert full.value.exit_code == 5
    assert len(calls(fake_gce, "instances.start")) == 1


# -- 6. an unknown zone ---------------------------------------------------------------------


def test_an_unknown_zone_is_a_config_error_naming_it(
    fake_gce: FakeGce, make_provider: MakeProvider
) -> None:
    provider = make_provider(gce={"zones": ["us-central1-z", ZONE_A]})
    with pytest.raises(ConfigError) as wrong:
        up(provider)
    assert str(wrong.value) == (
        '<test>: gce.zones: us-central1-z is a zone the Compute API does not know ("Unknown '
        'zone"); `gcloud compute zones list` shows the zones'
    )
    assert fake_gce.instances() == []
