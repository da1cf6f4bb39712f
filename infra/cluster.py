"""The library API behind every ``deploy.py`` command.

``Cluster`` ties a validated config to its provider, its state folder and
its jobs. It returns data and reports progress through callbacks; it never
prints and never imports click, so it can be driven from tests, notebooks
or another CLI.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra import commands, facts
from infra.config import ClusterConfig
from infra.errors import StateError
from infra.job import Job, JobRecord, JobSpec, new_run_id
from infra.lifecycle import (
    DownPlan,
    UpPlan,
    apply_down,
    apply_start,
    apply_stop,
    apply_up,
    plan_down,
    plan_up,
    require_running,
)
from infra.progress import ProgressEvent
from infra.providers import get_provider
from infra.providers.base import Node, NodeProvider, NodeState
from infra.state import ClusterState
from infra.tfconfig import build_tasks, participants
from infra.transport import Transport

log = logging.getLogger("tfcluster")


@dataclass(frozen=True)
class NodeView:
    """One row of ``status``: a node as the provider sees it, with its roles."""

    name: str
    status: str  # the provider's word (RUNNING, TERMINATED, ...) or ABSENT
    state: str  # pending | running | stopping | stopped | absent
    roles: list[str]
    zone: str | None
    internal_ip: str | None
    external_ip: str | None
    machine_type: str | None
    accelerators: str | None
    preemptible: bool
    declared: bool  # in cluster.yaml (an undeclared one still carries our label)
    hourly_usd: float | None  # this node as it is now (a stopped one pays its disk)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Cluster:
    def __init__(self, config: ClusterConfig, state: ClusterState | None = None) -> None:
        self.config = config
        self.state = state or ClusterState(config.name)
        self._provider: NodeProvider | None = None

    @property
    def provider(self) -> NodeProvider:
        if self._provider is None:
            self._provider = get_provider(self.config, self.state)
        return self._provider

    # -- what exists -------------------------------------------------------------

    def nodes(self) -> list[Node]:
        nodes = self.provider.non_terminated_nodes()
        self.state.update(
            nodes={
                n.name: {
                    "status": n.status,
                    "internal_ip": n.internal_ip,
                    "external_ip": n.external_ip,
                    "zone": n.zone,
                }
                for n in nodes
            }
        )
        return nodes

    def status(self) -> tuple[list[NodeView], float | None]:
        """Every declared node (absent ones too) and every labelled extra,
        with the estimated USD/hour of the cluster as it is now."""
        nodes = self.nodes()
        by_name = {n.name: n for n in nodes}
        names = list(self.config.nodes) + sorted(set(by_name) - set(self.config.nodes))
        views = []
        for name in names:
            node = by_name.get(name)
            views.append(
                NodeView(
                    name=name,
                    status=node.status if node else "ABSENT",
                    state=node.state.value if node else "absent",
                    roles=self.config.roles_of(name),
                    zone=node.zone if node else None,
                    internal_ip=node.internal_ip if node else None,
                    external_ip=node.external_ip if node else None,
                    machine_type=node.machine_type if node else None,
                    accelerators=node.accelerators if node else None,
                    preemptible=node.preemptible if node else False,
                    declared=name in self.config.nodes,
                    hourly_usd=self.provider.hourly_cost([node]) if node else None,
                )
            )
        return views, self.provider.hourly_cost(nodes)

    # -- lifecycle ---------------------------------------------------------------

    def plan_up(self) -> UpPlan:
        return plan_up(self.config, self.nodes(), self.provider.shared_resources())

    def up(
        self,
        plan: UpPlan,
        *,
        setup: bool = True,
        on_setup_event: Callable[[str, str], None] | None = None,
    ) -> tuple[list[Node], Any]:
        """Provision per ``plan``, then install and sync over SSH (unless
        ``setup`` is False or the provider is local). Returns the nodes and
        the setup report (None when no setup ran)."""
        nodes = apply_up(self.provider, plan, timeout=self.config.gce.operation_timeout)
        self.nodes()  # refresh the cached addresses
        report = None
        if setup and self.config.provider != "local":
            report = self.setup(nodes, on_event=on_setup_event)
        return nodes, report

    def setup(
        self, nodes: Sequence[Node], *, on_event: Callable[[str, str], None] | None = None
    ) -> Any:
        from infra.setup import setup_nodes

        with self.provider.transport(nodes) as transport:
            self._wait_ssh(transport)
            return setup_nodes(transport, self.config, on_event=on_event)

    @staticmethod
    def _wait_ssh(transport: Transport) -> None:
        wait_ready = getattr(transport, "wait_ready", None)
        if wait_ready is not None:
            wait_ready()

    def plan_down(self) -> DownPlan:
        return plan_down(self.nodes(), self.provider.shared_resources())

    def down(self, plan: DownPlan) -> None:
        before = self.nodes()
        apply_down(self.provider, plan)
        self._forget_addresses([n for n in before if n.name in plan.delete])
        self.state.update(nodes={})

    def stop(self) -> list[str]:
        before = self.nodes()
        stopped = apply_stop(self.provider, before)
        self._forget_addresses([n for n in before if n.name in stopped])
        return stopped

    def _forget_addresses(self, nodes: Sequence[Node]) -> None:
        """Unpin the host keys of addresses the nodes gave up. A GCE
        external IP is ephemeral: after a stop or delete it goes back to
        the pool and may come back on another VM, whose new host key must
        not be refused as "changed". Fixed addresses (provider ssh) stay."""
        if self.config.provider != "gce":
            return
        from infra.remote import forget_host

        for node in nodes:
            if node.ssh_host:
                forget_host(self.state.known_hosts, node.ssh_host, node.ssh_port)

    def start(self) -> list[Node]:
        nodes = apply_start(self.provider, self.nodes())
        self.nodes()
        return nodes

    # -- jobs --------------------------------------------------------------------

    def job_spec(self, *, resume: bool = False, **overrides: Any) -> JobSpec:
        """cluster.yaml's job with command-line overrides (None = keep)."""
        job = self.config.job
        values: dict[str, Any] = {
            "model": job.model,
            "mode": job.mode,
            "steps": job.steps,
            "batch_size": job.batch_size,
            "checkpoint_every": job.checkpoint_every,
            "learning_rate": job.learning_rate,
            "data_dir": job.data_dir,
            "extra_args": tuple(job.args),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        if values["mode"] == "async" and not self.config.roles.ps:
            raise StateError("async mode needs a ps node: add roles.ps or use --mode sync")
        run_id = new_run_id(values["model"], values["mode"])
        if resume:
            last = self.last_job()
            if last is None:
                raise StateError(
                    "nothing to resume: no earlier job of this cluster is known; "
                    "run `deploy.py train` first"
                )
            if (last.model, last.mode) != (values["model"], values["mode"]):
                raise StateError(
                    f"the last job trained {last.model} in {last.mode} mode; resume it with "
                    f"--model {last.model} --mode {last.mode}"
                )
            run_id = last.run_id
        return JobSpec(run_id=run_id, resume=resume, **values)

    def job_nodes(self, mode: str) -> list[str]:
        """The nodes that run a task of this mode, in cluster.yaml's order."""
        wanted = {n for role in participants(mode) for n in self.config.nodes_of(role)}
        return [n for n in self.config.nodes if n in wanted]

    def prepare_job(
        self,
        spec: JobSpec,
        *,
        on_event: Callable[[ProgressEvent], None],
        on_log: Callable[[str], None],
        sync: bool = True,
    ) -> Job:
        """Make sure the job's nodes run (a local cluster is brought up on
        the spot: it costs nothing), sync the code, and build the Job."""
        names = self.job_nodes(spec.mode)
        existing = self.nodes()
        if self.config.provider == "local":
            missing = [n for n in names if n not in {x.name for x in existing}]
            if missing:
                self.provider.create_nodes(missing)
                existing = self.nodes()
        require_running(self.config, existing, names)
        running = [n for n in existing if n.name in names]
        transport = self.provider.transport(running)
        if sync and self.config.provider != "local":
            from infra.setup import sync_nodes

            self._wait_ssh(transport)
            sync_nodes(transport, self.config)
        addresses = {n.name: n.internal_ip or "" for n in running}
        roles = {role: self.config.nodes_of(role) for role in ("ps", "worker", "chief")}
        tasks = build_tasks(spec.mode, roles, addresses, self.provider.task_port)
        return Job(
            transport,
            tasks,
            spec,
            env=self.provider.task_env(),
            on_event=on_event,
            on_log=on_log,
        )

    def remember(self, job: Job, exit_code: int | None = None) -> None:
        record = job.record()
        record.exit_code = exit_code
        self.state.update(last_job=record.__dict__)

    def last_job(self) -> JobRecord | None:
        data = self.state.get("last_job")
        return JobRecord.from_dict(data) if isinstance(data, dict) else None

    def attach(self, record: JobRecord) -> Job:
        """The Job object of an earlier (maybe --detach'ed) job, to watch,
        stop or fetch it."""
        existing = {n.name: n for n in self.nodes()}
        tasks = record.task_specs()
        nodes = sorted({t.node for t in tasks})
        require_running(self.config, list(existing.values()), nodes)
        transport = self.provider.transport([existing[n] for n in nodes])
        spec = JobSpec(
            run_id=record.run_id,
            model=record.model,
            mode=record.mode,
            steps=0,
            batch_size=0,
            checkpoint_every=0,
        )
        job = Job(transport, tasks, spec)
        job.output_dir = record.output_dir
        return job

    def local_run_dir(self, run_id: str, dest: Path | None = None) -> Path:
        return (dest or Path("runs") / self.config.name) / run_id

    # -- logs ---------------------------------------------------------------------

    def log_nodes(self, node: str | None) -> list[Node]:
        running = [n for n in self.nodes() if n.state is NodeState.RUNNING]
        if node is not None:
            if node not in self.config.nodes:
                raise StateError(
                    f"{node} is not a node of {self.config.name} "
                    f"({', '.join(self.config.nodes)})"
                )
            running = [n for n in running if n.name == node]
            if not running:
                raise StateError(f"{node} is not running; `deploy.py status` shows the nodes")
        return running

    def logs(
        self,
        node: str | None,
        *,
        lines: int,
        follow: bool,
        on_line: Callable[[str, str, str], None],
    ) -> None:
        """Task logs of the running nodes; ``on_line(node, task, line)``."""
        nodes = self.log_nodes(node)
        if not nodes:
            return
        with self.provider.transport(nodes) as transport:
            if not follow:
                for n in nodes:
                    result = transport.run(
                        n.name, commands.tail_logs(transport.layout(n.name), lines, False)
                    )
                    for task, line in facts.parse_tail(result.stdout):
                        on_line(n.name, task, line)
                return
            _follow_all(transport, [n.name for n in nodes], lines, on_line)


def _follow_all(
    transport: Transport,
    nodes: Sequence[str],
    lines: int,
    on_line: Callable[[str, str, str], None],
) -> None:
    """Follow every node's logs at once until Ctrl-C."""
    import threading

    def follow(node: str) -> None:
        task = ""

        def handle(line: str) -> None:
            nonlocal task
            header = facts.tail_header(line)
            if header is not None:
                task = header
            elif line:
                on_line(node, task, line)

        transport.stream(node, commands.tail_logs(transport.layout(node), lines, True), handle)

    threads = [threading.Thread(target=follow, args=(n,), daemon=True) for n in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)
