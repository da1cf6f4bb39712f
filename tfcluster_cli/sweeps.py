"""Sweeps from the command line: ``train --sweep``'s options turned into a
sweep of the trainer, and a sweep run with its live table, ending in one
line on how it went (``sweep`` and ``train --sweep`` both end here).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from infra.cluster.api import Cluster
from infra.errors import ConfigError, Interrupted
from tfcluster_cli import consoles
from tfcluster_cli.program import interrupted_by
from tfcluster_cli.progress_view import SweepView
from trainer import catalog

if TYPE_CHECKING:
    from infra.sweeps.spec import SweepSpec


def run_with_table(
    cluster: Cluster, spec: SweepSpec, *, per_node: int, dest: Path | None, workdir: Path | None
) -> None:
    """Run a sweep with a live table of its trials, then say how it went."""
    from infra.sweeps.run import run_sweep

    # A closed terminal stops the trials too: no record of them is kept
    # for `cancel` or `status` (a job, by contrast, goes on for `logs`).
    interrupted_by(signal.SIGHUP)
    destination = cluster.local_run_dir(spec.sweep_id, dest)
    view = SweepView(spec)
    try:
        with view:
            sweep_run = run_sweep(
                cluster,
                spec,
                per_node=per_node,
                dest=destination,
                workdir=workdir,
                on_change=view.change,
                on_ready=view.ready,
            )
    except Interrupted:
        # Every trial, those still queued (never started) too, as it ended.
        consoles.console.print(view.table(list(view.trials.values()), final=True))
        raise
    consoles.console.print(view.table(sweep_run.trials, final=True))
    consoles.console.print(f"results: {destination}", markup=False, soft_wrap=True)
    sweep_run.check()  # a failed trial: the sweep's error, exit 1
    consoles.console.print(
        consoles.as_invoked(
            f"[green]done[/]: {len(sweep_run.trials)} trial(s); "
            f"compare them with `deploy.py report {escape(str(destination))}`"
        )
    )


def train_sweep(
    cluster: Cluster,
    sweep_params: tuple[str, ...],
    trials: int | None,
    per_node: int,
    resume: bool,
    detach: bool,
    dest: Path | None,
    overrides: dict[str, Any],
) -> None:
    """``train --sweep``: single-process trainings, one per point of the
    flags' grid, each with ``train``'s other options."""
    from infra.sweeps.spec import parse_params, trainer_spec

    if not sweep_params:
        raise ConfigError("--trials and --per-node go with --sweep FLAG=V1,V2,...")
    if resume or detach:
        raise ConfigError("--sweep runs to the end: no --resume or --detach with it")
    if overrides.get("mode") is not None and not catalog.one_process(overrides["mode"]):
        raise ConfigError(
            f"--mode {overrides['mode']}: each trial of a sweep is one process "
            f"(mode {catalog.DEFAULT_MODE}); leave --mode out"
        )
    overrides["mode"] = overrides.get("mode") or catalog.DEFAULT_MODE
    params = parse_params(sweep_params, option="--sweep")
    base = cluster.train_spec(**overrides).program.argv
    spec = trainer_spec(base, params, trials=trials)
    run_with_table(cluster, spec, per_node=per_node, dest=dest, workdir=None)
