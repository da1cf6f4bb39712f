#!/usr/bin/env python3
"""tfcluster's command line: parse, call ``infra``, render.

Every command works on one cluster: ``--config cluster.yaml`` (or
$TFCLUSTER_CONFIG); with neither, the embedded local cluster (processes on
this machine). Expected errors are one red line and a distinct exit code
(see ``infra/errors.py``); anything else is a bug, logged with its
traceback to a file whose path is printed.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from infra.cluster import Cluster, NodeView
from infra.config import ClusterConfig, default_config, load_config
from infra.errors import ConfigError, Interrupted, JobFailed, TfclusterError
from infra.progress import ProgressEvent, describe, summary_text
from infra.state import tfcluster_home

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

EXIT_BUG = 70  # EX_SOFTWARE: not the user's fault; the debug log says why


class TfclusterGroup(click.Group):
    """Turns expected errors into one red line and their exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TfclusterError as exc:
            _fail(exc)
        except KeyboardInterrupt:
            _fail(Interrupted("interrupted"))
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception:
            log_path = _write_debug_log()
            err_console.print(
                f"[red]error: unexpected failure (a bug in tfcluster); details in {log_path}[/]"
            )
            ctx.exit(EXIT_BUG)


def _fail(exc: TfclusterError) -> None:
    err_console.print(f"[red]error: {exc}[/]", soft_wrap=True)
    if exc.hint:
        err_console.print(f"[dim]hint: {exc.hint}[/]", soft_wrap=True)
    raise click.exceptions.Exit(exc.exit_code)


def _write_debug_log() -> Path:
    path = tfcluster_home() / "debug.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n")
        out.write(traceback.format_exc())
    return path


def _setup_logging(verbose: bool) -> None:
    logger = logging.getLogger("tfcluster")
    logger.handlers[:] = [
        RichHandler(console=err_console, show_time=False, show_path=False, markup=False)
    ]
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False


pass_cluster = click.make_pass_decorator(Cluster)


@click.group(cls=TfclusterGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "-c",
    "config_path",
    envvar="TFCLUSTER_CONFIG",
    type=click.Path(dir_okay=False),
    help="cluster.yaml to use (default: the embedded local cluster).",
)
@click.option("--verbose", "-v", is_flag=True, help="Say what is being done.")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, verbose: bool) -> None:
    """Distributed TensorFlow on a few machines: up, train, status, down."""
    _setup_logging(verbose)
    config: ClusterConfig = load_config(config_path) if config_path else default_config()
    ctx.obj = Cluster(config)


# -- lifecycle -------------------------------------------------------------------


@cli.command()
@click.option("--skip-setup", is_flag=True, help="Provision only; no install or sync.")
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@pass_cluster
def up(cluster: Cluster, skip_setup: bool, dry_run: bool) -> None:
    """Create or start the nodes, then install TensorFlow and sync the code."""
    plan = cluster.plan_up()
    config = cluster.config
    if dry_run:
        console.print(f"plan for {config.name} ({config.provider}):")
        for line in plan.lines():
            console.print(f"  {line}")
        if not skip_setup and config.provider != "local":
            console.print("  setup   install + sync on every node")
        return
    if plan.changes:
        for line in plan.lines():
            if not line.startswith(("keep", "ensure")):
                console.print(f"[cyan]{line}[/]")
    with console.status("bringing the cluster up...") if console.is_terminal else _Null():
        nodes, report = cluster.up(
            plan,
            setup=not skip_setup,
            on_setup_event=lambda node, what: console.print(f"  {node}: {what}"),
        )
    if report is not None:
        for line in _report_lines(report):
            console.print(f"  {line}")
    if not plan.changes and (report is None or not getattr(report, "changed", True)):
        console.print(f"{config.name}: all {len(nodes)} nodes already up; nothing to do")
    else:
        console.print(f"[green]{config.name} is up[/]: {len(nodes)} nodes running")
    _print_status(cluster)


def _report_lines(report: Any) -> list[str]:
    lines = getattr(report, "lines", None)
    return list(lines()) if callable(lines) else [str(report)]


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_cluster
def status(cluster: Cluster, as_json: bool) -> None:
    """The nodes, their state and addresses, and the cost per hour."""
    if as_json:
        views, _ = cluster.status()
        click.echo(json.dumps([v.as_dict() for v in views], indent=2))
        return
    _print_status(cluster)


def _print_status(cluster: Cluster) -> None:
    views, cost = cluster.status()
    config = cluster.config
    table = Table(title=f"{config.name} ({config.provider})", title_justify="left")
    for column in ("node", "status", "roles", "zone", "internal ip", "external ip", "machine"):
        table.add_column(column)
    for v in views:
        table.add_row(
            v.name + ("" if v.declared else " (not in config)"),
            _colour_status(v),
            ",".join(v.roles) or "-",
            v.zone or "-",
            v.internal_ip or "-",
            v.external_ip or "-",
            _machine(v),
        )
    console.print(table)
    if cost is not None:
        console.print(f"estimated cost now: ${cost:.3f}/hour")
    job = cluster.last_job()
    if job is not None:
        state = "running or detached" if job.exit_code is None else f"exit code {job.exit_code}"
        console.print(f"last job: {job.run_id} ({state})")


def _colour_status(v: NodeView) -> str:
    colour = {"running": "green", "stopped": "yellow", "absent": "dim"}.get(v.state, "cyan")
    return f"[{colour}]{v.status}[/]"


def _machine(v: NodeView) -> str:
    text = v.machine_type or "-"
    if v.accelerators:
        text += f" + {v.accelerators}"
    if v.preemptible:
        text += " (spot)"
    return text


@cli.command()
@pass_cluster
def stop(cluster: Cluster) -> None:
    """Stop the nodes: no compute cost, disks kept."""
    stopped = cluster.stop()
    if stopped:
        console.print(f"[green]stopped[/] {', '.join(stopped)}")
    else:
        console.print("nothing running; nothing to stop")
    _print_status(cluster)


@cli.command()
@pass_cluster
def start(cluster: Cluster) -> None:
    """Start stopped nodes (their external IPs change)."""
    nodes = cluster.start()
    console.print(f"[green]running[/]: {', '.join(n.name for n in nodes)}")
    _print_status(cluster)


@cli.command()
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--dry-run", is_flag=True, help="Print what would be deleted; delete nothing.")
@pass_cluster
def down(cluster: Cluster, yes: bool, dry_run: bool) -> None:
    """Delete every node and the firewall rules: nothing left to pay for."""
    plan = cluster.plan_down()
    if not plan.delete and not plan.shared:
        console.print("nothing to delete")
        return
    console.print(f"{'plan' if dry_run else 'will delete'} for {cluster.config.name}:")
    for line in plan.lines():
        console.print(f"  {line}")
    if dry_run:
        return
    if not yes and not click.confirm("delete these, with their disks?", default=False):
        raise click.exceptions.Exit(1)
    cluster.down(plan)
    console.print(f"[green]deleted[/] {cluster.config.name}: nothing left running or billed")


# -- jobs ------------------------------------------------------------------------


@cli.command()
@click.option("--model", type=click.Choice(["cnn", "convnet", "dae", "sdae"]))
@click.option("--mode", type=click.Choice(["async", "sync", "average", "single"]))
@click.option("--steps", type=click.IntRange(min=1))
@click.option("--batch-size", type=click.IntRange(min=1))
@click.option("--learning-rate", type=click.FloatRange(min=0, min_open=True))
@click.option("--checkpoint-every", type=click.IntRange(min=1))
@click.option("--data-dir", help="MNIST folder on the nodes.")
@click.option("--resume", is_flag=True, help="Continue the last job from its checkpoint.")
@click.option("--detach", is_flag=True, help="Start the job and return at once.")
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), help="Where results go.")
@click.argument("trainer_args", nargs=-1, type=click.UNPROCESSED)
@pass_cluster
def train(
    cluster: Cluster,
    resume: bool,
    detach: bool,
    dest: Path | None,
    trainer_args: tuple[str, ...],
    **overrides: Any,
) -> None:
    """Run a training job: ps and workers, then the chief; stream its
    progress; bring the results home. Extra arguments after -- go to the
    trainer as they are."""
    if trainer_args:
        overrides["extra_args"] = tuple(cluster.config.job.args) + trainer_args
    spec = cluster.job_spec(resume=resume, **overrides)
    view = _TrainView(detach)
    job = cluster.prepare_job(spec, on_event=view.event, on_log=view.log)
    destination = cluster.local_run_dir(spec.run_id, dest)
    console.print(
        f"job {spec.run_id}: {spec.model}, {spec.mode}, "
        + ", ".join(f"{t.name}@{t.node}" for t in job.tasks)
    )
    if detach:
        job.start()
        cluster.remember(job)
        console.print(
            "[green]started[/]; follow with `deploy.py logs --follow`, "
            "bring results home with `deploy.py fetch`"
        )
        return
    cluster.remember(job)
    with view:
        code = job.run(destination)
    cluster.remember(job, exit_code=code)
    if code != 0:
        raise JobFailed(
            f"the chief exited with code {code}"
            + (f" (results so far in {destination})" if destination.exists() else ""),
            exit_code=code,
            hint="`deploy.py logs` shows every task's log",
        )
    # The chief's "done" event was shown as it came; say it only if it got lost.
    summary = None if job.summary else _read_summary(destination)
    if summary:
        console.print(f"[green]done[/]: {summary_text(summary)}")
    console.print(f"results: {destination}")


def _read_summary(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _TrainView:
    """Renders the chief's events: a live bar on a terminal, lines otherwise."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.progress: Progress | None = None
        self.task_id: Any = None

    def __enter__(self) -> _TrainView:
        if console.is_terminal and not self.quiet:
            self.progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} steps"),
                TextColumn("{task.fields[detail]}"),
                TimeRemainingColumn(),
                console=console,
            )
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def event(self, event: ProgressEvent) -> None:
        if self.progress is None:
            console.print(describe(event))
            return
        if event.kind == "start":
            self.task_id = self.progress.add_task(
                "training", total=event.get("total_steps") or None, detail=""
            )
            self.progress.console.print(describe(event))
        elif event.kind == "progress" and self.task_id is not None:
            metrics = event.get("metrics") or {}
            detail = f"loss {event.get('loss', 0):.4f} " + " ".join(
                f"{k} {v:.3f}" for k, v in metrics.items() if isinstance(v, int | float)
            )
            detail += f" {event.get('examples_per_sec', 0):.0f} ex/s"
            self.progress.update(self.task_id, completed=event.get("step", 0), detail=detail)
        elif event.kind != "progress":
            self.progress.console.print(describe(event))

    def log(self, line: str) -> None:
        # The chief's own log lines are in `deploy.py logs`; show errors here.
        if "Error" in line or "error:" in line or "Traceback" in line:
            (self.progress.console if self.progress else err_console).print(
                f"[dim]chief: {line}[/]", markup=True, soft_wrap=True
            )


@cli.command()
@click.argument("node", required=False)
@click.option("--follow", "-f", is_flag=True, help="Keep following until Ctrl-C.")
@click.option("--lines", "-n", default=50, show_default=True, type=click.IntRange(min=0))
@pass_cluster
def logs(cluster: Cluster, node: str | None, follow: bool, lines: int) -> None:
    """Task logs of every node (or one), each line prefixed with node/task."""

    def show(node_name: str, task: str, line: str) -> None:
        console.print(f"[cyan]{node_name}/{task}[/] {line}", markup=True, soft_wrap=True)

    try:
        cluster.logs(node, lines=lines, follow=follow, on_line=show)
    except KeyboardInterrupt:
        return


@cli.command()
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), help="Where to put it.")
@pass_cluster
def fetch(cluster: Cluster, dest: Path | None) -> None:
    """Bring the last job's run folder home (metrics, summary, plots, checkpoints)."""
    record = cluster.last_job()
    if record is None:
        raise ConfigError("no job to fetch yet: run `deploy.py train` first")
    job = cluster.attach(record)
    destination = cluster.local_run_dir(record.run_id, dest)
    job.fetch(destination)
    console.print(f"fetched {record.run_id} to {destination}")


@cli.command()
@click.argument("node")
@pass_cluster
def ssh(cluster: Cluster, node: str) -> None:
    """Open a shell on NODE."""
    nodes = cluster.log_nodes(node)
    with cluster.provider.transport(nodes) as transport:
        interactive = getattr(transport, "interactive", None)
        if interactive is None:
            home = cluster.state.dir / "nodes" / node
            console.print(f"{node} is a local folder: {home}")
            return
        raise click.exceptions.Exit(interactive(node))


@cli.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("report.png"),
    show_default=True,
    help="Where the speedup / time-to-accuracy plot goes.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable rows.")
def report(run_dirs: tuple[str, ...], plot: Path, as_json: bool) -> None:
    """Compare runs: training time, examples/s, speedup vs 1 worker, accuracy or PSNR."""
    from infra.report import ReportError, compute_rows, load_runs, write_plot

    try:
        runs = load_runs(run_dirs)
    except ReportError as exc:
        raise ConfigError(str(exc)) from None
    rows = compute_rows(runs)
    write_plot(runs, plot)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in rows], indent=2))
        return
    table = Table(title="training time, compared", title_justify="left")
    for column in ("run", "model", "mode", "workers", "steps", "seconds", "ex/s", "speedup"):
        table.add_column(column)
    table.add_column("result")
    for r in rows:
        table.add_row(
            r.run,
            r.model,
            r.mode,
            str(r.workers),
            str(r.steps),
            f"{r.training_seconds:.1f}",
            f"{r.examples_per_sec:.0f}",
            f"{r.speedup:.2f}x" if r.speedup is not None else "-",
            f"{r.metric} {r.value:.4f}" if r.metric and r.value is not None else "-",
        )
    console.print(table)
    console.print(f"plot: {plot}")


@cli.command("forget-host")
@click.argument("node")
@pass_cluster
def forget_host(cluster: Cluster, node: str) -> None:
    """Forget NODE's pinned SSH host key (after you re-created it on purpose)."""
    from infra.remote import forget_host as forget

    nodes = {n.name: n for n in cluster.nodes()}
    if node not in nodes or not nodes[node].ssh_host:
        raise ConfigError(f"{node} is not a node of {cluster.config.name} with an SSH address")
    forget(cluster.state.known_hosts, nodes[node].ssh_host or "", nodes[node].ssh_port)
    console.print(f"forgot the host key of {node}; the next connection pins the new one")


def main() -> None:
    cli(prog_name=os.path.basename(sys.argv[0]) or "deploy.py")


if __name__ == "__main__":
    main()
