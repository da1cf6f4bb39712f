"""The commands of a run's results: ``tensorboard`` on it, ``fetch`` it
home, list the bucket's ``runs``, and ``report`` (compare runs, or a
sweep's trials). Each parses its options, calls ``Cluster`` and renders
with tfcluster_cli/render.py and reports.py; deploy.py adds them to its
group.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import click

from infra.cluster.api import Cluster
from infra.errors import Interrupted
from tfcluster_cli import render
from tfcluster_cli.consoles import console
from tfcluster_cli.options import dest_option, pass_cluster
from tfcluster_cli.program import interrupted_by
from tfcluster_cli.reports import report_command


@click.command()
@click.argument("run_id", metavar="[RUN]", required=False)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    help="The port here (default 6006, or any free one when it is taken); "
    "a port given and taken is refused; 0: any free one.",
)
@pass_cluster
def tensorboard(cluster: Cluster, run_id: str | None, port: int | None) -> None:
    """TensorBoard on a job's run folder (default: the last job's), also
    while it trains: it runs on the chief's node, reached through an SSH
    tunnel to a port here (local cluster: directly). The URL is printed;
    Ctrl-C closes it and stops it on the node (exit 130)."""
    # A closed terminal stops it too: nothing else would (a job, by
    # contrast, is recorded, and goes on for `logs` and `fetch`).
    interrupted_by(signal.SIGHUP)
    starting = render.print_tensorboard_starting
    with cluster.tensorboard(
        run_id, local_port=6006 if port is None else port, exact_port=port is not None,
        on_starting=starting,
    ) as (board, wait):  # fmt: skip
        render.print_tensorboard(board)
        try:
            wait()
        except KeyboardInterrupt:
            console.print("closed TensorBoard", markup=False)
            raise click.exceptions.Exit(Interrupted.exit_code) from None


@click.command()
@click.argument("run", metavar="[RUN]", required=False)
@dest_option("Where to put it.")
@pass_cluster
def fetch(cluster: Cluster, run: str | None, dest: Path | None) -> None:
    """Bring a run folder home (default the last job's: metrics, summary,
    plots, checkpoints): from the nodes while they hold it, else from the
    cluster's bucket (a run id, or gs://...)."""
    run_id, destination, source = cluster.fetch_run(run, dest)
    where = "" if source == "the nodes" else f" from {source}"
    console.print(f"fetched {run_id}{where} to {destination}", markup=False)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable rows.")
@pass_cluster
def runs(cluster: Cluster, as_json: bool) -> None:
    """The runs of this cluster in its bucket: id, started, what ran, status, size."""
    found = cluster.bucket_runs()
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in found], indent=2))
        return
    render.print_bucket_runs(cluster.config.name, found)


@click.command()
@click.argument("run_dirs", nargs=-1, required=True)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where the speedup / time-to-accuracy plot goes (default report.png in the run's "
    "folder, or in the folder the runs share; for a sweep folder, inside it).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable rows.")
@click.option("--metric", help="A sweep's metric to rank the trials by (default test accuracy).")
@pass_cluster
def report(
    cluster: Cluster,
    run_dirs: tuple[str, ...],
    plot: Path | None,
    as_json: bool,
    metric: str | None,
) -> None:
    """Compare runs: training time, examples/s, speedup vs 1 worker, accuracy or PSNR.
    Given a sweep folder: its trials, the best one marked, and the metric
    against each parameter. A run in the cluster's bucket (gs://..., or a
    run id that is no folder here) is fetched first."""
    folders = tuple(
        str(cluster.bucket_copy(r)) if cluster.names_bucket_run(r) else r for r in run_dirs
    )
    report_command(folders, plot, as_json, metric)


COMMANDS = (tensorboard, fetch, runs, report)
