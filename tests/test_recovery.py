"""Recovery during a job (infra/jobs/recovery.py): the decisions, from what the
provider reports, and the bounded wait for capacity against the fake GCE
(its real client, no docker). The docker e2e (tests/docker/test_cost_e2e.py)
preempts a node mid-job and sees the job finish."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from infra.cluster.api import Cluster
from infra.config.loader import ClusterConfig
from infra.errors import CapacityError, JobFailed
from infra.jobs.job import Job
from infra.jobs.recovery import ABSENT, Policy, Recovery, critical, decide, lost_nodes, resumed
from infra.providers.base import Node, NodeState
from infra.spec.job import CANCELLED, JobRecord, JobSpec, Program, trainer_program
from infra.spec.tfconfig import TaskSpec
from infra.state.folder import ClusterState
from infra.state.lock import ClusterLock
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


# -- `deploy.py cancel` while a recovery runs ---------------------------------------


def spot_cluster(
    gce_config: Callable[..., ClusterConfig], tmp_path: Path
) -> tuple[Cluster, Cluster]:
    """A one-node Spot cluster, up, with a last job (x-1, its chief on
    pc-1); and the same cluster as another terminal sees it."""
    config = gce_config(gce={"preemptible": True}, nodes=["pc-1"], roles={
        "ps": [], "chief": "pc-1", "worker": []}, job={"mode": "single"})  # fmt: skip
    cluster = Cluster(config, ClusterState(config.name, home=tmp_path))
    cluster.up(cluster.plan_up(), setup=False)
    record = JobRecord(
        run_id="x-1",
        chief_node="pc-1",
        output_dir="tfcluster/runs/x-1",
        tasks=[{"type": "chief", "index": 0, "node": "pc-1", "host": "10.0.0.2", "port": 2224}],
        command=["python", "t.py"],
    )
    cluster.state.update(last_job=record.__dict__)
    return cluster, Cluster(config, ClusterState(config.name, home=tmp_path))


def spec_x1() -> JobSpec:
    return JobSpec(run_id="x-1", program=Program(argv=("python", "t.py"), task_types=("chief",)))


class Lost(Recovery):
    """A recovery whose job (followed over SSH in real life; the fake's
    instances have no sshd) just ended with its node lost."""

    def _follow(self, job: Job, dest: Path) -> tuple[int, JobFailed | None]:
        return -1, None


def test_cancel_while_a_node_is_started_again_ends_the_recovery(
    fake_gce: FakeGce,
    gce_config: Callable[..., ClusterConfig],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The recovery holds the cluster's lock while it waits for capacity
    (minutes): `cancel` waited for it, then failed "busy", and the job was
    restarted all the same. Now `cancel` marks the job at once and the
    recovery ends after its wait, the node left as it is."""
    monkeypatch.setenv("TFCLUSTER_LOCK_WAIT", "2")
    cluster, other = spot_cluster(gce_config, tmp_path)
    job = Job(cluster.provider.transport(cluster.nodes()), [task("chief", 0, "pc-1")], spec_x1())
    fake_gce.preempt("pc-1")
    fake_gce.stockout(None, ops=("start",))
    cancels: list[float] = []

    def cancel_meanwhile(seconds: float) -> None:  # another terminal, during the wait
        began = time.monotonic()
        record, stopped = other.cancel()
        cancels.append(time.monotonic() - began)
        assert (record.run_id, stopped) == ("x-1", [])

    notes: list[str] = []
    recovery = Lost(
        cluster, spec_x1(), workdir=None, on_event=lambda e: None, on_log=lambda line: None,
        on_note=notes.append, policy=Policy(capacity_tries=3), sleep=cancel_meanwhile,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, "tfcluster"):
        code, _ = recovery.watch(job, tmp_path / "dest")
    assert code == CANCELLED
    last = cluster.last_job()
    assert last is not None and last.cancelled and last.exit_code == CANCELLED
    assert cancels and cancels[0] < 1.5, cancels  # no wait for the recovery's lock
    assert "x-1 is being recovered" in caplog.text
    assert notes[-1] == "x-1 was cancelled while pc-1 could not start; it is not restarted"
    assert sum("no capacity yet" in n for n in notes) == 1  # no second try
    assert fake_gce.instance("pc-1")["status"] == "TERMINATED"


def test_cancel_during_the_follow_is_not_undone_by_a_lost_node(
    fake_gce: FakeGce, gce_config: Callable[..., ClusterConfig], tmp_path: Path
) -> None:
    """A cancel and a preemption at once: the job's end (remembered by its
    watch) kept the cancel, and the lost node is not started again."""
    cluster, other = spot_cluster(gce_config, tmp_path)
    job = Job(cluster.provider.transport(cluster.nodes()), [task("chief", 0, "pc-1")], spec_x1())
    fake_gce.preempt("pc-1")

    class Followed(Recovery):
        def _follow(self, job: Job, dest: Path) -> tuple[int, JobFailed | None]:
            other.cancel()
            cluster.remember(job, exit_code=-1)  # as Cluster.watch does at the end
            return -1, None

    notes: list[str] = []
    recovery = Followed(
        cluster, spec_x1(), workdir=None, on_event=lambda e: None, on_log=lambda line: None,
        on_note=notes.append, sleep=lambda s: None,
    )  # fmt: skip
    code, _ = recovery.watch(job, tmp_path / "dest")
    assert code == CANCELLED
    assert notes == ["x-1 was cancelled; it is not restarted"]
    assert fake_gce.instance("pc-1")["status"] == "TERMINATED"
    last = cluster.last_job()
    assert last is not None and last.cancelled and last.exit_code == CANCELLED


def test_a_recovery_starts_only_its_lost_nodes_through_the_lifecycles_start(
    fake_gce: FakeGce, gce_config: Callable[..., ClusterConfig], tmp_path: Path
) -> None:
    """``Recovery._start`` is ``Cluster.start`` (as `deploy.py start`) for the
    nodes it names: those come back running, another stopped node stays as
    it is, and the setup check runs once they run, under the lock held as
    "recover" (which `cancel` reads)."""
    config = gce_config(gce={"preemptible": True}, nodes=["pc-1", "pc-2"], roles={
        "ps": [], "chief": "pc-1", "worker": ["pc-2"]}, job={"mode": "sync"})  # fmt: skip
    cluster = Cluster(config, ClusterState(config.name, home=tmp_path))
    cluster.up(cluster.plan_up(), setup=False)
    fake_gce.preempt("pc-1")
    fake_gce.preempt("pc-2")
    holders: list[str] = []

    class Checked(Recovery):
        def _set_up(self, nodes: list[Node]) -> None:  # its SSH setup: no sshd in the fake
            holder = ClusterLock(cluster.state.lock_file, config.name).holder()
            holders.append(holder.command if holder else "")
            assert [(n.name, n.state) for n in nodes] == [("pc-1", NodeState.RUNNING)]

    recovery = Checked(
        cluster, spec_x1(), workdir=None, on_event=lambda e: None, on_log=lambda line: None,
        on_note=lambda line: None, sleep=lambda s: None,
    )  # fmt: skip
    recovery._start(["pc-1"])
    assert holders == ["recover"]
    assert fake_gce.instance("pc-1")["status"] == "RUNNING"
    assert fake_gce.instance("pc-2")["status"] == "TERMINATED"
