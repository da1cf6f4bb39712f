"""The library API behind every ``deploy.py`` command.

``Cluster`` ties a validated config to its provider, its state folder and
its jobs. It returns data and reports progress through callbacks; it never
prints and never imports click, so it can be driven from tests, notebooks
or another CLI.

This module holds the nodes' life: what exists (``status``), up, start,
stop, down, setup and autostop. ``Cluster`` gets the rest from the classes
it extends, one concept each: jobs (infra/cluster/jobs.py), runs brought
home (infra/cluster/runs.py), the cluster's bucket (infra/cluster/bucket.py),
looking into running nodes (infra/cluster/access.py), and what they all
stand on (infra/cluster/base.py). Callers only ever see ``Cluster``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from infra.cluster import autostop
from infra.cluster.access import ClusterAccess
from infra.cluster.base import locked
from infra.cluster.lifecycle import (
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
from infra.cluster.overview import ClusterOverview, NodeView
from infra.cluster.runs import ClusterRuns
from infra.errors import ConfigError, CredentialsError, StateError, TfclusterError
from infra.jobs.run import JobReporter, JobResult, run_job
from infra.node import facts, probes
from infra.providers.base import Node, NodeState, Pricing
from infra.transport.fanout import fan_out

if TYPE_CHECKING:
    from infra.setup.report import SetupReport

log = logging.getLogger("tfcluster")

# Seconds `status` waits for one node's nvidia-smi (it answers in well under
# one; a node that hangs must not hold the table up for long).
GPU_QUERY_TIMEOUT_S = 20.0
# A GPU node's GPUs in `status` when nobody asked it (`up --skip-setup`).
GPUS_UNCHECKED = "unchecked (setup skipped)"


class Cluster(ClusterRuns, ClusterAccess):
    """One cluster of cluster.yaml: its nodes (here), its jobs
    (``ClusterJobs``), its logs, TensorBoard and shells (``ClusterAccess``)."""

    def status(
        self,
        *,
        all_gpus: bool = False,
        ask_gpus: bool = True,
        nodes: Sequence[Node] | None = None,
    ) -> tuple[list[NodeView], float | None]:
        """Every declared node (absent ones too) and every labelled extra,
        with the estimated USD/hour of the cluster as it is now, and the
        GPUs of the running nodes that have an accelerator (with
        ``all_gpus``, of every running node: an ssh host's GPUs are not
        declared anywhere). ``ask_gpus`` False: no node is asked (after
        ``up(setup=False)`` nothing is installed to answer, and asking
        would wait for each node's SSH); their GPUs are said unchecked.
        ``nodes``: every node as just listed (``up``'s), instead of a new listing."""
        nodes = list(nodes) if nodes is not None else self.nodes()
        by_name = {n.name: n for n in nodes}
        asked = [n for n in nodes if n.state == NodeState.RUNNING and (all_gpus or n.accelerators)]
        if ask_gpus:
            gpus = self.gpus(asked)
        else:
            gpus = {n.name: facts.GpuReport((), GPUS_UNCHECKED) for n in asked}
        names = list(self.config.nodes) + sorted(set(by_name) - set(self.config.nodes))
        pricing = self.provider if isinstance(self.provider, Pricing) else None
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
                    hourly_usd=pricing.hourly_cost([node]) if node and pricing else None,
                    gpus=gpus.get(name),
                    service_account=node.service_account if node else None,
                    scopes=list(node.scopes) if node else None,
                )
            )
        return views, pricing.hourly_cost(nodes) if pricing else None

    def overview(
        self,
        *,
        all_gpus: bool = False,
        ask_gpus: bool = True,
        nodes: Sequence[Node] | None = None,
    ) -> ClusterOverview:
        """``status`` (see there) with the rest of what `deploy.py status`
        shows: where the cost comes from, autostop, the last job."""
        views, cost = self.status(all_gpus=all_gpus, ask_gpus=ask_gpus, nodes=nodes)
        return ClusterOverview(
            name=self.config.name,
            provider=self.config.provider,
            views=views,
            hourly_usd=cost,
            price_source=(
                self.provider.price_source()
                if cost is not None and isinstance(self.provider, Pricing)
                else None
            ),
            idle=self.autostop_status(),
            last_job=self.last_job(),
        )

    def gpus(self, nodes: Sequence[Node]) -> dict[str, facts.GpuReport]:
        """What nvidia-smi says on each of these running nodes, all at once.
        A node that cannot be asked gets a report saying why: ``status``
        must show the rest of the cluster whatever one node does."""
        if not nodes:
            return {}
        out: dict[str, facts.GpuReport] = {}
        try:
            transport = self.provider.transport(nodes)
        except TfclusterError as exc:
            return {n.name: facts.GpuReport((), f"not asked: {exc}") for n in nodes}

        def ask(node: str) -> facts.GpuReport:
            try:
                result = transport.run(node, probes.gpu_query(), timeout=GPU_QUERY_TIMEOUT_S)
            except TfclusterError as exc:
                return facts.GpuReport((), f"not asked: {exc}")
            return facts.parse_gpus(result.stdout)

        with transport:
            out.update(fan_out(ask, [n.name for n in nodes]).results)
        return out

    # -- lifecycle ---------------------------------------------------------------

    def plan_up(self, *, dry_run: bool = False) -> UpPlan:
        """What ``up`` would do, after the provider has refused what its
        cloud would refuse. With ``dry_run``, missing credentials do not stop
        the plan: the checks that need no cloud have run, and the plan is made
        as if no node existed yet, and says so (``UpPlan.unlisted``): what
        `up` would create and what it costs are known from cluster.yaml alone."""
        try:
            self.provider.check_config()
            # Listed first: the owner check reads the same listing (gce).
            existing = self.nodes()
            self.provider.check_owner()
        except CredentialsError as exc:
            if not dry_run:
                raise
            plan = plan_up(self.provider, [])
            return replace(plan, unlisted=str(exc))
        return plan_up(self.provider, existing)

    @locked("up")
    def up(
        self,
        plan: UpPlan,
        *,
        setup: bool = True,
        on_setup_event: Callable[[str, str], None] | None = None,
        autostop: int | Literal["off"] | None = None,
    ) -> tuple[list[Node], SetupReport | None]:
        """Provision per ``plan``, then install and sync over SSH (unless
        ``setup`` is False or the provider is local). Returns the nodes and
        the setup report (None when no setup ran). ``plan`` is what the
        user was shown; what is done is planned again under the lock.
        ``autostop``: seconds, or "off", instead of cluster.yaml's."""
        # Planned again under the lock: a parallel `up` we waited for may
        # have made the nodes ``plan`` would create; what is done follows
        # what exists now (the lock itself keeps two zone failovers apart).
        after = self.config.autostop if autostop is None else autostop
        self.check_autostop(after)
        plan = self.plan_up()
        # Before anything is created: a bucket the nodes cannot write is
        # found now, not at the end of the first job.
        self.check_bucket()
        capabilities = self.provider.capabilities()
        nodes = apply_up(self.provider, plan, timeout=capabilities.operation_timeout)
        # The cached addresses, as the nodes run now: those up waited for and
        # the others (undeclared: up leaves them alone) as the plan listed them.
        self.remember_nodes([*nodes, *(n for n in plan.nodes if n.name not in self.config.nodes)])
        report: SetupReport | None = None
        if setup and capabilities.needs_setup:
            report = self.setup(nodes, on_event=on_setup_event)
        # Not given anywhere: keep what the nodes hold (`deploy.py autostop`).
        self.ensure_autostop(nodes, False if after is None else None if after == "off" else after)
        return nodes, report

    # -- autostop (infra/cluster/autostop.py) ---------------------------------------------

    def ensure_autostop(self, nodes: Sequence[Node], after: int | bool | None = False) -> None:
        """After nodes (re)started: set ``after`` seconds (None: off) on
        them, or with False keep the setting they hold; either way their
        watchers run again (a container has no init to restart them). Only
        where autostop was ever used: otherwise no extra round trip."""
        if self.provider.capabilities().cannot_self_stop is not None:
            return
        if after is False and not self.state.get("autostop_used"):
            return
        with self.provider.transport(nodes) as transport:
            transport.wait_ready()
            autostop.apply(
                transport,
                [n.name for n in nodes],
                None if after is False else after,
                keep=after is False,
            )
        if after is not False:
            self.state.update(autostop_used=True, autostop=after)

    def check_autostop(self, after: int | str | None) -> None:
        """A ConfigError unless the provider's nodes can stop themselves,
        when autostop is to be set (``after`` seconds; "off" or None is
        never refused)."""
        why = self.provider.capabilities().cannot_self_stop
        if isinstance(after, int) and why is not None:
            raise ConfigError(f"autostop: {why}")

    def preemptible(self) -> bool:
        """Whether a node of the cluster is a Spot VM (the provider says):
        then `train` and `run` recover from preemptions by default."""
        return any(n.preemptible for n in self.nodes())

    @locked("autostop")
    def set_autostop(self, after: int | None) -> list[str]:
        """Change autostop on the running cluster (None: off); the nodes."""
        self.check_autostop(after)
        existing = self.nodes()
        if not any(n.state is NodeState.RUNNING for n in existing):
            raise StateError(
                f"{self.config.name} is not up: autostop is set on running nodes; "
                "`deploy.py up --autostop 30m` brings it up with it"
            )
        require_running(self.provider, existing, list(self.config.nodes))
        nodes = [n for n in existing if n.name in self.config.nodes]
        self.ensure_autostop(nodes, after)
        return [n.name for n in nodes]

    def autostop_status(self, nodes: Sequence[Node] | None = None) -> autostop.ClusterIdle | None:
        """The autostop setting and how long the cluster has been idle, as
        its running nodes say; None where autostop does not apply or was
        never used."""
        if self.provider.capabilities().cannot_self_stop is not None:
            return None
        if not self.state.get("autostop_used") and self.config.autostop is None:
            return None
        running = [n for n in (nodes or self.nodes()) if n.state is NodeState.RUNNING]
        if not running:
            setting = self.state.get("autostop")
            return autostop.ClusterIdle(
                after_s=setting if isinstance(setting, int) else None,
                idle_s=None,
                busy=False,
                installed=False,
            )
        with self.provider.transport(running) as transport:
            return autostop.summarize(autostop.report(transport, [n.name for n in running]))

    def setup(
        self,
        nodes: Sequence[Node],
        *,
        on_event: Callable[[str, str], None] | None = None,
        sync: bool = True,
    ) -> SetupReport:
        """Install on ``nodes`` and (unless ``sync`` is False: a recovery
        keeps the code its job started with) sync the code to them."""
        from infra.setup.nodes import setup_nodes

        with self.provider.transport(nodes) as transport:
            transport.wait_ready()
            # A node (re)started with autostop on runs its watcher from the
            # boot: an install of minutes must not look idle to it.
            with self.keep_busy(transport, [n.name for n in nodes], "setup"):
                return setup_nodes(transport, self.config, on_event=on_event, sync=sync)

    def plan_down(self) -> DownPlan:
        return plan_down(self.nodes(), self.provider.shared_resources())

    @locked("down")
    def down(self, plan: DownPlan, *, on_wait: Callable[[int], None] | None = None) -> None:
        """Delete (or release) what ``plan`` names, once the nodes' pending
        uploads to the bucket are done (``on_wait(n)`` when there are)."""
        before = self.nodes()
        self._upload_first(before, on_wait)
        # Only what was confirmed and still exists (a `down` we waited for
        # may have deleted it; nodes made since were not confirmed).
        plan = replace(plan, delete=[n for n in plan.delete if n in {b.name for b in before}])
        apply_down(self.provider, plan)
        self._forget_addresses([n for n in before if n.name in plan.delete])
        self.state.update(nodes={})

    @locked("stop")
    def stop(self, *, on_wait: Callable[[int], None] | None = None) -> list[str]:
        before = self.nodes()
        self._upload_first(before, on_wait)
        stopped = apply_stop(self.provider, before)
        self._forget_addresses([n for n in before if n.name in stopped])
        return stopped

    def _upload_first(self, nodes: Sequence[Node], on_wait: Callable[[int], None] | None) -> None:
        """Before the nodes stop or go: their runs into the bucket. A job
        still running would keep its uploader waiting for its chief: its
        tasks are stopped first (as `cancel` does; the chief has its grace
        to save a checkpoint), then the uploads are waited for."""
        if self.storage is None or not any(n.state is NodeState.RUNNING for n in nodes):
            return
        if self.running_job() is not None:
            log.warning("a job is running: stopping it, then waiting for its upload")
            self._cancel()
        self.drain_uploads(nodes, on_wait)

    def _forget_addresses(self, nodes: Sequence[Node]) -> None:
        """Unpin the host keys of addresses the nodes gave up. A GCE
        external IP is ephemeral: after a stop or delete it goes back to
        the pool and may come back on another VM, whose new host key must
        not be refused as "changed". Fixed addresses (provider ssh) stay."""
        if not self.provider.capabilities().ephemeral_addresses:
            return
        from infra.transport.host_keys import forget_host

        for node in nodes:
            if node.ssh_host:
                forget_host(self.state.known_hosts, node.ssh_host, node.ssh_port)

    def start(
        self,
        names: Sequence[str] | None = None,
        *,
        command: str = "start",
        start_nodes: Callable[[list[str]], None] | None = None,
        on_running: Callable[[list[Node]], None] = lambda nodes: None,
    ) -> list[Node]:
        """Start the stopped nodes (of ``names``, default every one), under
        the lock (held as ``command``), and wait until they run; then
        ``on_running(nodes)`` (a recovery checks their setup) and their
        autostop watchers again. ``start_nodes``: how the stopped ones are
        started (default the provider's; a recovery retries a zone out of
        capacity). The named nodes (default every declared one), running."""
        with self.lock(command):
            nodes = apply_start(self.provider, self.nodes(), names, start=start_nodes)
            self.nodes()
            on_running(nodes)
            self.ensure_autostop(nodes)
            return nodes

    # -- a job's whole life, as one call (infra/jobs/run.py; the steps are in
    # infra/cluster/jobs.py) ----------------------------------------------------

    def train(
        self,
        *,
        resume: bool = False,
        detach: bool = False,
        dest: Path | None = None,
        recover: bool = True,
        reporter: JobReporter | None = None,
        **overrides: Any,
    ) -> JobResult:
        """The built-in trainer as a job, from launch to the fetched run
        folder (infra/jobs/run.py): cluster.yaml's job with ``overrides``
        (model, mode, steps, batch_size, learning_rate, checkpoint_every,
        data_dir, extra_args; None keeps the config's)."""
        spec = self.train_spec(resume=resume, **overrides)
        return run_job(self, spec, detach=detach, dest=dest, recover=recover, reporter=reporter)

    def run_program(
        self,
        argv: Sequence[str],
        *,
        ps: bool = True,
        env: Mapping[str, str] | None = None,
        workdir: Path | None = None,
        detach: bool = False,
        dest: Path | None = None,
        recover: bool = True,
        reporter: JobReporter | None = None,
    ) -> JobResult:
        """The user's program ``argv`` as a job (see ``run_spec``), run in
        the working folder (``workdir``, else job.workdir), from launch to
        the fetched run folder (infra/jobs/run.py)."""
        folder = self.workdir(workdir)
        spec = self.run_spec(argv, ps=ps, env=env, workdir=folder)
        return run_job(
            self, spec, detach=detach, dest=dest, workdir=folder, recover=recover,
            reporter=reporter,
        )  # fmt: skip
