"""The tasks of a job find each other at the nodes' internal addresses.

On GCE a node has two: the internal one (the VPC, where the firewall lets
the cluster's own instances reach the TensorFlow ports) and the external
one (where tfcluster's SSH goes). TF_CONFIG built from the external ones
would send the gRPC traffic out through the internet and into the deny
rule. The docker e2e sees it on the wire; this is the decision itself, on
the fake Compute API where the two addresses differ."""

from __future__ import annotations

import json
from collections.abc import Callable

from infra.cluster.api import Cluster
from infra.config.loader import ClusterConfig
from infra.spec.tfconfig import tf_config_json
from infra.state.folder import ClusterState
from tests.fake_gce import FakeGce

pytest_plugins = ["tests.fake_gce.fixtures"]


def test_tf_config_names_the_internal_addresses(
    fake_gce: FakeGce, gce_config: Callable[..., ClusterConfig]
) -> None:
    config = gce_config()
    cluster = Cluster(config, ClusterState(config.name))
    cluster.provider.prepare()
    cluster.provider.create_nodes(config.nodes)
    nodes = {n.name: n for n in cluster.provider.non_terminated_nodes()}
    assert all(n.internal_ip != n.external_ip for n in nodes.values())

    tasks = cluster.job_tasks(("chief", "ps", "worker"), config.nodes)
    assert [(t.name, t.node) for t in tasks] == [
        ("ps-0", "pc-1"), ("worker-0", "pc-2"), ("worker-1", "pc-3"), ("worker-2", "pc-4"),
        ("chief-0", "pc-1"),
    ]  # fmt: skip
    for task in tasks:
        assert task.host == nodes[task.node].internal_ip
    ports = config.ports
    chief = json.loads(tf_config_json(tasks, tasks[-1]))
    assert chief == {
        "cluster": {
            "chief": [f"{nodes['pc-1'].internal_ip}:{ports.chief}"],
            "ps": [f"{nodes['pc-1'].internal_ip}:{ports.ps}"],
            "worker": [f"{nodes[n].internal_ip}:{ports.worker}" for n in ("pc-2", "pc-3", "pc-4")],
        },
        "task": {"type": "chief", "index": 0},
    }
