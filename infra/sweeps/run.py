"""Many experiments at once on a cluster: ``run_sweep`` gets the nodes ready
(the one way every job takes, ``Cluster.ready_nodes``: the lock, no job
running, SSH up, synced, busy for autostop), checks that ``--per-node``
trials fit each node's CPUs, and runs the ``Sweep`` engine
(infra/sweeps/engine.py) there, each trial's node mirroring its run folder
into the cluster's bucket when it has one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from infra.errors import ConfigError
from infra.jobs.destination import check_destination
from infra.node import commands, facts
from infra.sweeps.engine import Sweep
from infra.sweeps.spec import SweepSpec
from infra.sweeps.trial import Trial
from infra.transport.base import Transport

if TYPE_CHECKING:
    from infra.cluster.api import Cluster


# -- on a cluster ----------------------------------------------------------------


def check_per_node(transport: Transport, nodes: Sequence[str], per_node: int) -> dict[str, int]:
    """Each node's CPU count; ``ConfigError`` when ``per_node`` trials do
    not fit one (a node that cannot say is not refused)."""
    results = transport.run_all({n: commands.cpu_count() for n in nodes}, timeout=60)
    cpus = {n: c for n in nodes if (c := facts.parse_cpu_count(results[n].stdout)) is not None}
    for node in nodes:
        have = cpus.get(node)
        if have is not None and per_node > have:
            raise ConfigError(
                f"--per-node {per_node}: {node} has {have} CPU{'s' if have > 1 else ''}; "
                f"give --per-node {have} or less"
            )
    return cpus


def _upload_trial(
    cluster: Cluster, transport: Transport, sweep: Sweep, node: str, trial: Trial
) -> None:
    """The trial's node mirrors its run folder into the sweep's bucket folder."""
    url = cluster.bucket_url(sweep.spec.sweep_id)
    cluster.start_uploader(
        transport,
        node,
        run_id=f"{sweep.spec.sweep_id}-{trial.name}",
        url=url.child(trial.name) if url else None,
        run_dir=sweep.run_dir(node, trial),
        watch_task=trial.name,
        label=f"{sweep.spec.sweep_id} {trial.name}",
        command=sweep.spec.command(trial.params),
    )


def run_sweep(
    cluster: Cluster,
    spec: SweepSpec,
    *,
    per_node: int,
    dest: Path,
    workdir: Path | None = None,
    on_change: Callable[[Trial], None] = lambda t: None,
    on_ready: Callable[[Sweep], None] = lambda s: None,
) -> Sweep:
    """Run a sweep on every node of ``cluster``. The cluster's lock is held
    throughout: a sweep's trials fill the nodes, and a job, an ``up`` or a
    ``down`` meanwhile would meet or kill them (Ctrl-C ends the sweep)."""
    if not spec.points:
        raise ConfigError("nothing to sweep: give at least one --param NAME=V1,V2,...")
    check_destination(dest, dest)  # before any trial: its results must have a place here
    # The nodes are busy for autostop from before the sync to the last
    # fetch: one that waits for the next trial or fetch is not idle.
    with (
        cluster.ready_nodes(
            "sweep",
            list(cluster.config.nodes),
            workdir=None if spec.builtin else workdir,
            check=lambda transport, nodes: check_per_node(transport, nodes, per_node),
        ) as ready,
        ready.transport as transport,
    ):
        nodes = ready.names
        url = cluster.bucket_url(spec.sweep_id)
        sweep = Sweep(
            transport,
            nodes,
            spec,
            per_node=per_node,
            dest=dest,
            env=cluster.provider.task_env(),
            workdir=workdir,
            on_change=on_change,
            bucket=str(url) if url else None,
            on_started=lambda node, t: _upload_trial(cluster, transport, sweep, node, t),
        )
        on_ready(sweep)
        try:
            sweep.run()
        finally:
            if url is not None:  # the trials' last uploads, bounded, said
                cluster.wait_uploads(transport, nodes, url)
        return sweep
