"""Data as the terminal shows it: the status table, the plan of ``up
--dry-run``, a job's outcome, the report of a sweep. Names, addresses,
parameters and metric names are the user's or a node's text: every cell is
``Text`` (never markup) and no terminal control gets through.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from infra.cluster import Cluster, NodeView
from infra.errors import ConfigError
from infra.facts import GpuReport
from infra.jobrun import JobResult
from infra.lifecycle import UpPlan
from infra.progress import metrics_text, summary_text
from infra.text import node_text
from tfcluster_cli import consoles

if TYPE_CHECKING:
    from infra.report import Row, Run


def print_up_plan(cluster: Cluster, plan: UpPlan, skip_setup: bool) -> None:
    """``up --dry-run``: what would be made, of what kind, where, at what
    cost; computed from cluster.yaml (no credentials needed for that)."""
    config, provider = cluster.config, cluster.provider
    consoles.console.print(f"plan for {config.name} ({config.provider}):", markup=False)
    if plan.unlisted:
        consoles.console.print(
            f"  (existing nodes not listed: {node_text(plan.unlisted)}; "
            "planned as if none existed)",
            markup=False,
            soft_wrap=True,
        )
    for line in plan.lines(provider.planned_node()):
        consoles.console.print(f"  {node_text(line)}", markup=False, soft_wrap=True)
    if not skip_setup and provider.needs_setup:
        consoles.console.print("  setup   install + sync on every node")
    running = len(plan.create) + len(plan.start) + len(plan.wait) + len(plan.reuse)
    cost = provider.planned_cost(running) if running else None
    if cost is not None:
        source = provider.price_source()
        consoles.console.print(
            f"estimated cost once up: ${cost:.3f}/hour for {running} node(s) while running"
            + (f" ({source})" if source else ""),
            markup=False,
            soft_wrap=True,
        )


def print_status(cluster: Cluster, *, all_gpus: bool = False) -> None:
    views, cost = cluster.status(all_gpus=all_gpus)
    config = cluster.config
    # Cells are Text, never markup: names and addresses come from the config
    # and the provider.
    table = Table(title=Text(f"{config.name} ({config.provider})"), title_justify="left")
    columns = ["node", "status", "roles", "zone", "internal ip", "external ip", "machine"]
    # A cost column only where the provider prices its nodes (gce); GPUs
    # where they were asked for.
    priced = any(v.hourly_usd is not None for v in views)
    asked = any(v.gpus is not None for v in views)
    extra = [*(["$/hour"] if priced else []), *(["gpus"] if asked else [])]
    for column in [*columns, *extra]:
        table.add_column(column, justify="right" if column == "$/hour" else "left")
    for v in views:
        cells = [
            cell(v.name + ("" if v.declared else " (not in config)")),
            colour_status(v),
            cell(",".join(v.roles) or "-"),
            cell(v.zone or "-"),
            cell(v.internal_ip or "-"),
            cell(v.external_ip or "-"),
            cell(machine_text(v)),
        ]
        if priced:
            cells.append(cell(f"{v.hourly_usd:.3f}" if v.hourly_usd is not None else "-"))
        if asked:
            cells.append(cell(gpus_text(v.gpus)))
        table.add_row(*cells)
    consoles.console.print(table)
    if cost is not None:
        source = cluster.provider.price_source()
        consoles.console.print(
            f"estimated cost now: ${cost:.3f}/hour" + (f" ({source})" if source else ""),
            markup=False,
            soft_wrap=True,
        )
    idle = cluster.autostop_status()
    if idle is not None:
        consoles.console.print(idle.text(), markup=False, soft_wrap=True)
    job = cluster.last_job()
    if job is not None:
        state = "running or detached" if job.exit_code is None else f"exit code {job.exit_code}"
        consoles.console.print(
            f"last job: {job.run_id}: {node_text(job.label)} ({state})",
            markup=False,
            soft_wrap=True,
        )


def cell(text: str, style: str = "") -> Text:
    """A table cell of data: never markup, no terminal control."""
    return Text(node_text(text), style=style)


def colour_status(v: NodeView) -> Text:
    colour = {"running": "green", "stopped": "yellow", "absent": "dim"}.get(v.state, "cyan")
    return cell(v.status, colour)


def gpus_text(report: GpuReport | None) -> str:
    """``2 x Tesla T4, 15 GiB, busy 0 %, 93 %``; the problem where there are none."""
    if report is None:
        return "-"
    if not report.gpus:
        return report.problem or "none"
    groups: dict[tuple[str, int | None], list[int | None]] = {}
    for gpu in report.gpus:
        groups.setdefault((gpu.name, gpu.memory_mib), []).append(gpu.utilization)
    parts = []
    for (name, mib), busy in groups.items():
        memory = f", {mib / 1024:.0f} GiB" if mib is not None else ""
        load = ", ".join("?" if b is None else f"{b} %" for b in busy)
        parts.append(f"{len(busy)} x {name}{memory}, busy {load}")
    return "; ".join(parts)


def machine_text(v: NodeView) -> str:
    text = v.machine_type or "-"
    if v.accelerators:
        text += f" + {v.accelerators}"
    if v.preemptible:
        text += " (spot)"
    return text


def print_job_outcome(result: JobResult) -> None:
    """What `train` and `run` say once the job ended (or, detached, started)."""
    if result.exit_code is None:
        consoles.console.print(
            "[green]started[/]; follow with `deploy.py logs --follow`, "
            "bring results home with `deploy.py fetch`, stop it with `deploy.py cancel`"
        )
        return
    result.check()
    # The chief's "done" event was shown as it came; say it only if it got lost.
    if result.summary and not result.job.summary:
        consoles.console.print(f"[green]done[/]: {escape(summary_text(result.summary))}")
    if result.fetched:
        consoles.console.print(f"results: {result.destination}", markup=False, soft_wrap=True)
    else:  # the fetch failed (warned): the run folder is still on the chief's node
        consoles.console.print(
            "results: still on the chief's node; `deploy.py fetch --dest FOLDER`"
        )


def print_sweep_report(folder: Path, plot: Path | None, as_json: bool, metric: str | None) -> None:
    from infra.report import ReportError
    from infra.sweep_report import load_sweep, write_sweep_plot

    try:
        sweep_report = load_sweep(folder, metric)
    except ReportError as exc:
        raise ConfigError(str(exc)) from None
    plot = write_sweep_plot(sweep_report, plot or folder / "report.png")
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in sweep_report.rows], indent=2))
        return
    shown = sweep_report.metric
    order = "higher" if sweep_report.higher_is_better else "lower"
    title = f"sweep {sweep_report.sweep_id}"
    if shown:
        title += f": best {shown} ({order} is better)"
    table = Table(title=Text(node_text(title)), title_justify="left")
    for column in ("", "trial", *sweep_report.params, "state", "node", "seconds", "metrics"):
        table.add_column(cell(column))
    for r in sweep_report.rows:
        metrics = dict(r.metrics)
        if shown in metrics:  # the ranking metric first
            metrics = {shown: metrics.pop(shown), **metrics}
        table.add_row(
            cell("*" if r.best else "", "bold green"),
            cell(str(r.trial)),
            *(cell(r.params.get(p, "-")) for p in sweep_report.params),
            cell(r.state, "" if r.state == "done" else "red"),
            cell(r.node),
            cell(f"{r.seconds:.1f}" if r.seconds is not None else "-"),
            cell(metrics_text(dict(list(metrics.items())[:3]), ".4g") or "-"),
            style="bold" if r.best else "",
        )
    consoles.console.print(table)
    best = sweep_report.best
    if best is not None and shown:
        consoles.console.print(
            node_text(
                f"best: trial {best.trial} ({params_text(best.params)}): "
                f"{shown} {best.metrics[shown]:.4g}"
            ),
            markup=False,
            soft_wrap=True,
        )
    consoles.console.print(f"plot: {plot}", markup=False)


def params_text(params: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def print_run_comparison(runs: list[Run], rows: list[Row], plot: Path) -> None:
    """``report`` of job run folders: their times, speedup and result
    side by side, the speedup's caveat, each ensemble's gain."""
    from infra.report import speedup_note
    from infra.sweep_report import ensemble_text

    table = Table(title="training time, compared", title_justify="left")
    for column in ("run", "model", "mode", "workers", "steps", "seconds", "ex/s", "speedup"):
        table.add_column(column)
    table.add_column("result")
    for r in rows:
        # Text cells: folder names and summary fields are data, not markup.
        table.add_row(
            *(
                cell(str(value))
                for value in (
                    r.run,
                    r.model,
                    r.mode,
                    r.workers,
                    r.steps,
                    f"{r.training_seconds:.1f}",
                    f"{r.examples_per_sec:.0f}",
                    f"{r.speedup:.2f}x" if r.speedup is not None else "-",
                    f"{r.metric} {r.value:.4f}" if r.metric and r.value is not None else "-",
                )
            )
        )
    consoles.console.print(table)
    note = speedup_note(rows)
    if note:
        consoles.console.print(note, markup=False, soft_wrap=True)
    for run in runs:
        if (gain := ensemble_text(run.summary)) is not None:
            consoles.console.print(
                f"{run.path.name}: {node_text(gain)}", markup=False, soft_wrap=True
            )
    consoles.console.print(f"plot: {plot}", markup=False, soft_wrap=True)
