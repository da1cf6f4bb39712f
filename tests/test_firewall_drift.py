"""A firewall rule changed by hand in one field only is put back by the
next `up` (prepare). Each drift alone: a shape comparison that forgot a
field (source_ranges was the one once forgotten) would leave a rule opened
to the world by hand open for good, as long as nothing else changed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from google.cloud import compute_v1

from infra.config.loader import ClusterConfig
from infra.providers.gce import GceProvider
from infra.state.folder import ClusterState
from tests.fake_gce import FakeGce

pytest_plugins = ["tests.fake_gce.fixtures"]

SSH, GRPC, DENY = "tfcluster-tfc-test-ssh", "tfcluster-tfc-test-grpc", "tfcluster-tfc-test-grpc-deny"


def _open_to_the_world(rule: compute_v1.Firewall) -> None:
    rule.source_ranges = ["0.0.0.0/0"]


def _weaker(rule: compute_v1.Firewall) -> None:
    rule.priority = 65534  # as weak as the default network's allow-internal


def _every_vm(rule: compute_v1.Firewall) -> None:
    rule.target_tags = ["http-server"]


def _another_port(rule: compute_v1.Firewall) -> None:
    rule.allowed = [compute_v1.Allowed(I_p_protocol="tcp", ports=["22", "8080"])]


@pytest.mark.parametrize(
    ("name", "drift", "field"),
    [
        (SSH, _open_to_the_world, "sourceRanges"),
        (GRPC, _open_to_the_world, "sourceRanges"),
        (DENY, _weaker, "priority"),
        (GRPC, _every_vm, "targetTags"),
        (SSH, _another_port, "allowed"),
    ],
)
def test_a_rule_drifted_in_one_field_is_repaired(
    fake_gce: FakeGce,
    gce_config: Callable[..., ClusterConfig],
    name: str,
    drift: Callable[[compute_v1.Firewall], None],
    field: str,
) -> None:
    config = gce_config(gce={"ssh_source_ranges": ["198.51.100.7/32"]})
    provider = GceProvider(config, ClusterState(config.name))
    provider.prepare()
    want = fake_gce.firewall(name)
    assert want is not None
    # By hand, through the API (console, gcloud): the whole rule replaced.
    rule = provider._get_firewall(name)
    assert rule is not None
    drift(rule)
    provider._wait_operation(provider._update_firewall(rule), zone=None, what="drift")
    drifted = fake_gce.firewall(name)
    assert drifted is not None and drifted.get(field) != want.get(field)

    fake_gce.reset_calls()
    provider.prepare()
    assert [(c.op, c.name) for c in fake_gce.mutating_calls()] == [("firewalls.update", name)]
    repaired = fake_gce.firewall(name)
    assert repaired is not None and repaired.get(field) == want.get(field)
    fake_gce.reset_calls()
    provider.prepare()  # and then it is left alone
    assert fake_gce.mutating_calls() == []
