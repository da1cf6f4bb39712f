"""The one TF_CONFIG builder."""

from __future__ import annotations

import json

import pytest

from infra.spec.tfconfig import build_tasks, tf_config, tf_config_json
from trainer.catalog import mode

ROLES = {"ps": ["pc-1"], "chief": ["pc-1"], "worker": ["pc-2", "pc-3", "pc-4"]}
ADDRESSES = {"pc-1": "10.0.0.1", "pc-2": "10.0.0.2", "pc-3": "10.0.0.3", "pc-4": "10.0.0.4"}
PORTS = {"ps": 2222, "worker": 2223, "chief": 2224}


def port_for(node: str, task_type: str, index: int) -> int:
    return PORTS[task_type]


def test_async_cluster_has_chief_ps_and_workers_in_start_order() -> None:
    tasks = build_tasks(mode("async").task_types, ROLES, ADDRESSES, port_for)
    assert [t.name for t in tasks] == ["ps-0", "worker-0", "worker-1", "worker-2", "chief-0"]
    config = tf_config(tasks, tasks[2])
    assert config == {
        "cluster": {
            "chief": ["10.0.0.1:2224"],
            "ps": ["10.0.0.1:2222"],
            "worker": ["10.0.0.2:2223", "10.0.0.3:2223", "10.0.0.4:2223"],
        },
        "task": {"type": "worker", "index": 1},
    }
    assert json.loads(tf_config_json(tasks, tasks[2])) == config


@pytest.mark.parametrize("name", ["sync", "average"])
def test_collective_modes_leave_out_the_ps(name: str) -> None:
    tasks = build_tasks(mode(name).task_types, ROLES, ADDRESSES, port_for)
    assert {t.type for t in tasks} == {"chief", "worker"}
    assert "ps" not in tf_config(tasks, tasks[0])["cluster"]  # type: ignore[operator]


def test_single_is_the_chief_alone() -> None:
    tasks = build_tasks(mode("single").task_types, ROLES, ADDRESSES, port_for)
    assert [t.name for t in tasks] == ["chief-0"]


def test_errors() -> None:
    with pytest.raises(ValueError, match="needs at least one ps node"):
        build_tasks(mode("async").task_types, {**ROLES, "ps": []}, ADDRESSES, port_for)
    with pytest.raises(ValueError, match="exactly one chief, got 2"):
        build_tasks(mode("async").task_types, {**ROLES, "chief": ["pc-1", "pc-2"]}, ADDRESSES,
                    port_for)
    with pytest.raises(ValueError, match="no internal address"):
        build_tasks(mode("async").task_types, ROLES, {"pc-1": "10.0.0.1"}, port_for)
    with pytest.raises(ValueError, match="both listen"):
        build_tasks(mode("async").task_types, ROLES, ADDRESSES, lambda n, t, i: 2222)
    with pytest.raises(ValueError, match="unknown mode"):
        mode("ring")
    with pytest.raises(ValueError, match="unknown task type 'evaluator'"):
        build_tasks(("chief", "evaluator"), ROLES, ADDRESSES, port_for)
