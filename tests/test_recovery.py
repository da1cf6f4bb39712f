"""Recovery during a job (infra/recovery.py): the decisions, from what the
provider reports, and the bounded wait for capacity against the fake GCE
(its real client, no docker). The docker e2e (tests/docker/test_cost_e2e.py)
preempts a node mid-job and sees the job finish."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from infra.cluster import Cluster
from infra.config import ClusterConfig
from infra.errors import CapacityError
from infra.job_spec import JobSpec, Program, trainer_program
from infra.providers.base import Node, NodeState
from infra.recovery import ABSENT, Policy, Recovery, critical, decide, lost_nodes, resumed
from infra.state import ClusterState
from infra.tfconfig import TaskSpec
from tests.fake_gce import FakeGce

pytest_plugins = ["tests.fake_gce.fixtures"]


def task(kind: str, index: int, node: str) -> TaskSpec:
    return TaskSpec(type=kind, index=index, node=node, host="10.0.0.1", port=2222)


ASYNC = [task("chief", 0, "pc-1"), task("ps", 0, "pc-1")] + [
    task("worker", i, f"pc-{i + 2}") for i in range(3)
]
COLLECTIVE = [task("chief", 0, "pc-1"), task("worker", 0, "pc-2"), task("worker", 1, "pc-3")]


def node(name: str, state: NodeState, status: str) -> Node:
    return Node(name=name, state=state, status=status)


def test_lost_nodes_are_those_not_running() -> None:
    existing = [
        node("pc-1", NodeState.STOPPED, "TERMINATED"),
        node("pc-2", NodeState.RUNNING, "RUNNING"),
        node("pc-3", NodeState.STOPPING, "STOPPING"),
    ]
    assert lost_nodes(existing, ["pc-1", "pc-2", "pc-3", "pc-4"]) == {
        "pc-1": "TERMINATED",
        "pc-3": "STOPPING",
        "pc-4": ABSENT,
    }


def test_what_a_job_cannot_do_without() -> None:
    # With ps tasks: the chief's and the ps's node; a worker's is not critical.
    assert critical({"pc-3": "TERMINATED"}, ASYNC) == []
    assert critical({"pc-1": "TERMINATED", "pc-3": "TERMINATED"}, ASYNC) == ["pc-1"]
    # Collective: every worker takes part in every step.
    assert critical({"pc-3": "TERMINATED"}, COLLECTIVE) == ["pc-3"]
    assert critical({"pc-9": "TERMINATED"}, COLLECTIVE) == []


@pytest.mark.parametrize(
    ("succeeded", "lost", "restarts", "action", "nodes"),
    [
        (True, {}, 0, "done", ()),
        # An async worker lost on the way: the job did without it; it comes back after.
        (True, {"pc-3": "TERMINATED"}, 0, "done", ("pc-3",)),
        (False, {}, 0, "fail", ()),  # failed by itself: not ours to retry
        (False, {"pc-1": "TERMINATED"}, 0, "restart", ("pc-1",)),
        (False, {"pc-1": "STOPPING", "pc-2": "TERMINATED"}, 2, "restart", ("pc-1", "pc-2")),
        (False, {"pc-1": "TERMINATED"}, 3, "give_up", ("pc-1",)),
        (False, {"pc-1": ABSENT}, 0, "deleted", ("pc-1",)),
    ],
)
def test_decide(
    succeeded: bool, lost: dict[str, str], restarts: int, action: str, nodes: tuple[str, ...]
) -> None:
    decision = decide(succeeded=succeeded, lost=lost, restarts=restarts, max_restarts=3)
    assert (decision.action, decision.nodes) == (action, nodes)


def test_resumed_jobs_keep_their_run_id_and_resume() -> None:
    builtin = JobSpec(
        run_id="cnn-async-1",
        program=trainer_program(
            model="cnn", mode="async", steps=10, batch_size=8, checkpoint_every=5
        ),
        model="cnn",
        mode="async",
    )
    again = resumed(builtin)
    assert again.run_id == builtin.run_id and again.resume
    assert again.program.argv == (*builtin.program.argv, "--resume")
    assert resumed(again).program.argv == again.program.argv  # once only
    own = JobSpec(run_id="train-1", program=Program(argv=("python", "t.py"), task_types=("chief",)))
    assert resumed(own).program.argv == ("python", "t.py") and resumed(own).resume


def test_capacity_refusals_are_retried_with_backoff_then_exit_5(
    fake_gce: FakeGce, gce_config: Callable[..., ClusterConfig], tmp_path: Path
) -> None:
    config = gce_config(gce={"preemptible": True}, nodes=["pc-1"], roles={
        "ps": [], "chief": "pc-1", "worker": []}, job={"mode": "single"})  # fmt: skip
    cluster = Cluster(config, ClusterState(config.name, home=tmp_path))
    cluster.up(cluster.plan_up(), setup=False)
    assert cluster.preemptible()
    fake_gce.preempt("pc-1")
    fake_gce.stockout(None, ops=("start",))  # no zone has room now
    slept: list[float] = []
    notes: list[str] = []
    recovery = Recovery(
        cluster,
        JobSpec(run_id="x-1", program=Program(argv=("true",), task_types=("chief",))),
        workdir=None,
        on_event=lambda e: None,
        on_log=lambda line: None,
        on_note=notes.append,
        policy=Policy(capacity_tries=3, capacity_first_s=4, capacity_max_s=6),
        sleep=slept.append,
    )
    with pytest.raises(CapacityError) as info:
        recovery._start(["pc-1"])
    assert info.value.exit_code == 5
    assert "3 tries" in str(info.value) and "ZONE_RESOURCE_POOL_EXHAUSTED" in str(info.value)
    assert "train --resume" in (info.value.hint or "")
    assert slept == [4, 6]  # doubling, up to the bound
    assert len(notes) == 2 and all("no capacity yet" in n for n in notes)
    assert fake_gce.instance("pc-1")["status"] == "TERMINATED"
