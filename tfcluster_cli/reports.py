"""``report``: job run folders compared (times, speedup, result, a plot)
or a sweep folder's trials ranked by a metric, as tables on the terminal
or JSON rows. Folder names, parameters and metric names are data: every
cell is ``Text``. ``report_command`` reads the runs and writes the plot;
the ``print_*`` functions print what they are given.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table
from rich.text import Text

from infra.errors import ConfigError
from infra.jobs.progress import metrics_text, number
from infra.text import node_text
from tfcluster_cli import consoles
from tfcluster_cli.render import cell, params_text

if TYPE_CHECKING:
    from infra.reports.compare import Row, Run
    from infra.reports.sweeps import SweepReport


def report_command(
    run_dirs: tuple[str, ...], plot: Path | None, as_json: bool, metric: str | None
) -> None:
    """``report``'s body: the runs read and their plot written here, then
    printed (the printers below print what they are given). Runs
    compared, or, given one sweep folder, its trials."""
    from infra.reports.compare import ReportError, compute_rows, load_runs, write_plot
    from infra.reports.sweeps import is_sweep, load_sweep, write_sweep_plot

    if len(run_dirs) == 1 and is_sweep(run_dirs[0]):
        folder = Path(run_dirs[0])
        try:
            sweep_report = load_sweep(folder, metric)
        except ReportError as exc:
            raise ConfigError(str(exc)) from None
        plot = write_sweep_plot(sweep_report, plot or folder / "report.png")
        if as_json:
            click.echo(json.dumps([r.as_dict() for r in sweep_report.rows], indent=2))
            return
        print_sweep_report(sweep_report, plot)
        return
    plot = plot or default_plot(run_dirs)
    try:
        runs = load_runs(run_dirs)
    except ReportError as exc:
        raise ConfigError(str(exc)) from None
    rows = compute_rows(runs)
    write_plot(runs, plot)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in rows], indent=2))
        return
    print_run_comparison(runs, rows, plot)


def default_plot(run_dirs: tuple[str, ...]) -> Path:
    """Where ``report`` puts its plot without --plot: into the run's folder
    (one run), or the folder the runs share (runs/<cluster>/); the current
    folder only for runs of different folders."""
    parents = {Path(d).resolve().parent for d in run_dirs}
    if len(run_dirs) == 1:
        return Path(run_dirs[0]) / "report.png"
    if len(parents) == 1:
        return Path(run_dirs[0]).parent / "report.png"
    return Path("report.png")


def print_sweep_report(sweep_report: SweepReport, plot: Path) -> None:
    """A sweep's trials, the best one marked, and where its plot is."""
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


def print_run_comparison(runs: list[Run], rows: list[Row], plot: Path) -> None:
    """``report`` of job run folders: their times, speedup and result
    side by side, the speedup's caveat, each ensemble's gain."""
    from infra.reports.compare import speedup_note
    from infra.reports.sweeps import ensemble_text

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
                    number(r.training_seconds, ".1f"),  # or the summary's text
                    number(r.examples_per_sec, ".0f"),
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
        print_placement(run)
    consoles.console.print(f"plot: {plot}", markup=False, soft_wrap=True)


def print_placement(run: Run) -> None:
    """A ``--mode layers`` run: the devices and the variables each holds,
    and the pipeline's bubble (nothing for another run)."""
    from infra.reports.placement import pipeline_text, placement_rows

    rows = placement_rows(run.summary)
    if not rows:
        return
    table = Table(title=Text(f"{node_text(run.path.name)}: where the variables live"),
                  title_justify="left")  # fmt: skip
    for column in ("device", "MB", "variables"):
        table.add_column(column)
    for row in rows:
        size = f"{row.bytes / 1e6:.2f}" if row.bytes is not None else "-"
        table.add_row(cell(row.device), cell(size), cell(", ".join(row.variables)))
    consoles.console.print(table)
    if (line := pipeline_text(run.summary)) is not None:
        consoles.console.print(node_text(line), markup=False, soft_wrap=True)
