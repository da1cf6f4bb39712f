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
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from infra.cluster.access import check_exec
from infra.cluster.api import Cluster
from infra.config.loader import ClusterConfig, default_config, load_config
from infra.errors import Interrupted
from tfcluster_cli import render
from tfcluster_cli.consoles import console, setup_logging
from tfcluster_cli.group import TfclusterGroup
from tfcluster_cli.options import (
    dest_option,
    detach_option,
    duration_option,
    env_option,
    env_pairs_option,
    job_option,
    raw_option,
    recover_option,
    workdir_option,
)
from tfcluster_cli.program import check_arguments, interrupted_by, version
from tfcluster_cli.progress_view import ExecView, Null, TrainView, log_printer
from tfcluster_cli.provider_words import down_words
from tfcluster_cli.reports import report_command
from tfcluster_cli.sweeps import run_with_table, train_sweep
from trainer import catalog
from trainer.loop.progress import process_age

pass_cluster = click.make_pass_decorator(Cluster)


@click.group(cls=TfclusterGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    version(), "--version", "-V", prog_name="tfcluster", message="%(prog)s %(version)s"
)
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
    setup_logging(verbose)
    config: ClusterConfig = load_config(config_path) if config_path else default_config()
    ctx.obj = Cluster(config)
    ctx.obj.started = _STARTED


# -- lifecycle -------------------------------------------------------------------


@cli.command()
@click.option("--skip-setup", is_flag=True, help="Provision only; no install or sync.")
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option(
    "--autostop",
    "autostop_text",
    metavar="DURATION",
    help="Stop the nodes once no job has run for this long (45s, 30m, 2h, off); "
    "instead of cluster.yaml's autostop.",
)
@pass_cluster
def up(cluster: Cluster, skip_setup: bool, dry_run: bool, autostop_text: str | None) -> None:
    """Create or start the nodes, then install TensorFlow and sync the code."""
    after = duration_option("--autostop", autostop_text) if autostop_text is not None else None
    cluster.check_autostop(after if autostop_text is not None else cluster.config.autostop)
    plan = cluster.plan_up(dry_run=dry_run)
    if dry_run:
        render.print_up_plan(cluster, plan, skip_setup)
        return
    render.print_up_changes(plan)
    with console.status("bringing the cluster up...") if console.is_terminal else Null():
        nodes, report = cluster.up(
            plan,
            setup=not skip_setup,
            autostop="off" if autostop_text is not None and after is None else after,
            on_setup_event=render.print_setup_event,
        )
    # What `up` did not touch (nodes cluster.yaml no longer declares) as
    # its plan listed them: the table needs no listing of its own. Without
    # setup, the GPU nodes are not asked: nothing was installed to answer.
    extras = [n for n in plan.nodes if n.name not in cluster.config.nodes]
    overview = cluster.overview(ask_gpus=report is not None, nodes=[*nodes, *extras])
    render.print_up_outcome(plan, nodes, report, overview)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--gpus",
    "all_gpus",
    is_flag=True,
    help="Ask every running node for its GPUs (nodes with an accelerator always are).",
)
@pass_cluster
def status(cluster: Cluster, as_json: bool, all_gpus: bool) -> None:
    """The nodes, their state and addresses, their GPUs, and the cost per hour."""
    if as_json:
        views, _ = cluster.status(all_gpus=all_gpus)
        click.echo(json.dumps([v.as_dict() for v in views], indent=2))
        return
    render.print_status(cluster.overview(all_gpus=all_gpus))


@cli.command()
@pass_cluster
def stop(cluster: Cluster) -> None:
    """Stop the nodes: no compute cost, disks kept (pending uploads to the
    bucket first)."""
    stopped = cluster.stop(on_wait=render.print_upload_wait)
    render.print_stopped(stopped, cluster.overview())


@cli.command()
@pass_cluster
def start(cluster: Cluster) -> None:
    """Start stopped nodes (their external IPs change)."""
    nodes = cluster.start()
    render.print_started(nodes, cluster.overview())


# `down` answered "n": nothing was changed, and a script that runs `down`
# without --yes can tell that from success.
EXIT_CANCELLED = 1


@cli.command("autostop")
@click.argument("duration", metavar="DURATION|off")
@pass_cluster
def autostop_(cluster: Cluster, duration: str) -> None:
    """Stop every node once no job task has run on it for DURATION (45s,
    30m, 2h), or `off`. The nodes stop themselves (a guest shutdown: GCE
    keeps the disks and bills no compute); `start` brings them back."""
    after = duration_option("autostop", duration)
    render.print_autostop(after, cluster.set_autostop(after))


@cli.command()
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--dry-run", is_flag=True, help="Print what down would do; change nothing.")
@pass_cluster
def down(cluster: Cluster, yes: bool, dry_run: bool) -> None:
    """Take the cluster down: gce and local delete every node and firewall
    rule (nothing left to pay for); ssh stops tfcluster's tasks and leaves
    the hosts as they are. Answering "n" changes nothing (exit 1)."""
    plan = cluster.plan_down()
    provider = cluster.provider
    if not render.print_down_plan(cluster, plan) or dry_run:
        return
    question = down_words(provider.capabilities()).question
    if not yes and not click.confirm(question, default=False):
        console.print("cancelled: nothing changed", markup=False)
        raise click.exceptions.Exit(EXIT_CANCELLED)
    cluster.down(plan, on_wait=render.print_upload_wait)
    render.print_down_done(cluster)


# -- jobs ------------------------------------------------------------------------


@cli.command(
    epilog="""\b
Examples:
  deploy.py train --steps 200
  deploy.py train -- --epochs 1                        # trainer flags after --
  deploy.py train --mode average -- --average-every 5
  deploy.py train --mode layers -- --placement conv:0,dense:1 --micro-batches 4""",
)
@job_option("--model", "model", type=click.Choice(catalog.MODELS))
@job_option("--mode", "mode", type=click.Choice(catalog.MODE_NAMES))
@job_option("--steps", "steps", type=click.IntRange(min=1))
@job_option("--batch-size", "batch_size", type=click.IntRange(min=1))
@job_option("--learning-rate", "learning_rate", type=click.FloatRange(min=0, min_open=True))
@job_option("--checkpoint-every", "checkpoint_every", type=click.IntRange(min=1))
@job_option("--data-dir", "data_dir", help="MNIST folder on the nodes.")
@click.option("--resume", is_flag=True, help="Continue the last job from its checkpoint.")
@detach_option
@dest_option("Where results go.")
@click.option(
    "--sweep",
    "sweep_params",
    multiple=True,
    metavar="FLAG=V1,V2,...",
    help="A sweep instead of one job: one single-process trial per combination of "
    "trainer flag values (repeatable), e.g. --sweep learning_rate=1e-3,1e-4.",
)
@click.option("--trials", type=click.IntRange(min=1), help="--sweep: the first N points only.")
@click.option("--per-node", type=click.IntRange(min=1), help="--sweep: trials at once per node.")
@recover_option
@click.argument("trainer_args", nargs=-1, type=click.UNPROCESSED)
@pass_cluster
def train(
    cluster: Cluster,
    resume: bool,
    detach: bool,
    dest: Path | None,
    sweep_params: tuple[str, ...],
    trials: int | None,
    per_node: int | None,
    no_recover: bool,
    trainer_args: tuple[str, ...],
    **overrides: Any,
) -> None:
    """Run the built-in trainer: ps and workers, then the chief; stream its
    progress; bring the results home. Extra arguments after -- go to the
    trainer as they are (`python -m trainer --help` lists them). With
    --sweep, a sweep of single-process trainings instead (see `sweep`)."""
    if trainer_args:
        overrides["extra_args"] = tuple(cluster.config.job.args) + trainer_args
    if sweep_params or trials or per_node:
        train_sweep(cluster, sweep_params, trials, per_node or 1, resume, detach, dest, overrides)
        return
    view = TrainView(detach)
    result = cluster.train(
        resume=resume, detach=detach, dest=dest, recover=not no_recover, reporter=view,
        **overrides,
    )  # fmt: skip
    render.print_job_outcome(result)
    result.check()  # a failed job: its error, and its exit code


# `run` and `exec`: where COMMAND runs, synced to the nodes first.


@cli.command(
    context_settings={"allow_interspersed_args": False},
    epilog="""\b
Examples:
  deploy.py run -- python train.py --epochs 3
  deploy.py run --no-ps --env BATCH=256 -- python collective.py
  deploy.py --config cluster.yaml run --detach -- python -m mypkg.train""",
)
@click.option(
    "--no-ps",
    is_flag=True,
    help="A collective program (MultiWorkerMirroredStrategy): TF_CONFIG names the chief "
    "and the workers only, and no ps task is started.",
)
@env_pairs_option(
    "An environment variable for every task (repeatable; beside cluster.yaml's job.env)."
)
@workdir_option
@detach_option
@dest_option("Where the chief's TFCLUSTER_RUN_DIR comes home (default runs/<cluster>/<run id>).")
@recover_option
@raw_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@pass_cluster
def run(
    cluster: Cluster,
    no_ps: bool,
    env_pairs: tuple[str, ...],
    workdir: Path | None,
    detach: bool,
    dest: Path | None,
    no_recover: bool,
    raw: bool,
    command: tuple[str, ...],
) -> None:
    """Run your own TensorFlow program COMMAND as a distributed job.

    One process per task of cluster.yaml's roles (ps, workers, chief), each
    started in the synced working folder with TF_CONFIG for its task (what
    tf.distribute's TFConfigClusterResolver reads), TFCLUSTER_RUN_DIR (an
    output folder; the chief's comes home at the end), TFCLUSTER_RUN_ID,
    TFCLUSTER_TASK (e.g. worker-1) and `python` on PATH with TensorFlow. A
    requirements.txt in the working folder is installed on the nodes.

    The ps and worker tasks start first; the chief starts once each of them
    listens on its TF_CONFIG port (as tf.distribute.Server and
    MultiWorkerMirroredStrategy do), within 240 s. COMMAND runs as it is,
    not through a shell (for pipes or `&&`, run `bash -c '...'`). The job
    ends when the chief's process ends; the other tasks are then stopped,
    and `run` exits with the chief's exit code.
    """
    env = env_option(env_pairs)
    view = TrainView(detach, echo=True, raw=raw)
    result = cluster.run_program(
        command, ps=not no_ps, env=env, workdir=workdir, detach=detach, dest=dest,
        recover=not no_recover, reporter=view,
    )  # fmt: skip
    render.print_job_outcome(result)
    result.check()  # a failed job: its error, and its exit code


@cli.command("exec", context_settings={"allow_interspersed_args": False})
@click.option(
    "--node",
    "nodes",
    multiple=True,
    metavar="NODE",
    help="Only this node (repeatable); default every running node.",
)
@workdir_option
@raw_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@pass_cluster
def exec_(
    cluster: Cluster,
    nodes: tuple[str, ...],
    workdir: Path | None,
    raw: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND on every node (or the --node ones) in the working folder,
    e.g. `exec -- nvidia-smi`, `exec -- pip list`. Output lines are prefixed
    with the node's name; exits 0 only if COMMAND succeeded everywhere."""
    view = ExecView(raw)
    folder = cluster.workdir(workdir)
    codes = cluster.exec(command, list(nodes) or None, workdir=folder, on_line=view.line)
    check_exec(codes)


@cli.command()
@pass_cluster
def cancel(cluster: Cluster) -> None:
    """Stop every task of the running job on purpose."""
    render.print_cancelled(*cluster.cancel())


@cli.command()
@click.argument("node", required=False)
@click.option(
    "--follow", "-f", is_flag=True, help="Keep following while the last job runs (or until Ctrl-C)."
)
@click.option("--lines", "-n", default=50, show_default=True, type=click.IntRange(min=0))
@click.option(
    "--raw",
    is_flag=True,
    help="Every line as written: the chief's progress events as JSON (@tfcluster {json}), "
    "and TensorFlow's load-time log (oneDNN, CPU features, CUDA not found), left out otherwise.",
)
@pass_cluster
def logs(cluster: Cluster, node: str | None, follow: bool, lines: int, raw: bool) -> None:
    """Task logs of every node (or one), each line prefixed with node/task.
    The chief's progress events are shown as sentences (`--raw`: as JSON).
    --follow ends when the job does, saying so. Before any job, or with no
    node running: one line saying so, exit 3."""
    end = cluster.logs(node, lines=lines, follow=follow, on_line=log_printer(raw))
    if end is not None:
        render.print_job_end(end)


@cli.command()
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


@cli.command()
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


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable rows.")
@pass_cluster
def runs(cluster: Cluster, as_json: bool) -> None:
    """The runs of this cluster in its bucket: id, started, what ran, status, size."""
    found = cluster.bucket_runs()
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in found], indent=2))
        return
    render.print_bucket_runs(cluster.config.name, found)


@cli.command()
@click.argument("node")
@pass_cluster
def ssh(cluster: Cluster, node: str) -> None:
    """Open a shell on NODE."""
    shell = cluster.shell(node)
    if shell.folder is not None:
        console.print(f"{node} is a local folder: {shell.folder}", markup=False)
        return
    raise click.exceptions.Exit(shell.exit_code)


@cli.command()
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


# -- sweeps ----------------------------------------------------------------------


@cli.command(
    context_settings={"allow_interspersed_args": False},
    epilog="""\b
Examples:
  deploy.py sweep --param lr=0.1,0.01 --param batch=32,64 -- python train.py --lr {lr}
  deploy.py sweep --param seed=1,2,3,4 --per-node 2 -- python train.py""",
)
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="NAME=V1,V2,...",
    help="A parameter and its values (repeatable): the trials are every combination. "
    "Each trial gets NAME in upper case as a variable, and {NAME} in COMMAND replaced.",
)
@click.option("--trials", type=click.IntRange(min=1), help="Only the first N points of the grid.")
@click.option(
    "--per-node",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Trials at a time on each node (at most its CPUs).",
)
@env_pairs_option("An environment variable for every trial (repeatable).")
@workdir_option
@dest_option("Where the sweep folder goes (default runs/<cluster>/<sweep id>).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@pass_cluster
def sweep(
    cluster: Cluster,
    params: tuple[str, ...],
    trials: int | None,
    per_node: int,
    env_pairs: tuple[str, ...],
    workdir: Path | None,
    dest: Path | None,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND once per point of a parameter grid: independent trials,
    each one process on one node (no TF_CONFIG), as many at a time as the
    nodes times --per-node. Each trial gets TFCLUSTER_TRIAL, TFCLUSTER_RUN_DIR
    (it comes home into runs/<cluster>/<sweep id>/trial-N) and its values.
    A failing trial is reported and the others go on; Ctrl-C stops them all.
    `deploy.py report SWEEP_FOLDER` compares the trials."""
    from infra.sweeps.spec import command_spec, parse_params

    spec = command_spec(
        command,
        parse_params(params),
        trials=trials,
        env={**cluster.config.job.env, **env_option(env_pairs)},
    )
    run_with_table(cluster, spec, per_node=per_node, dest=dest, workdir=cluster.workdir(workdir))


@cli.command("forget-host")
@click.argument("node")
@pass_cluster
def forget_host(cluster: Cluster, node: str) -> None:
    """Forget NODE's pinned SSH host key (after you re-created it on purpose)."""
    cluster.forget_host(node)
    console.print(
        f"forgot the host key of {node}; the next connection pins the new one", markup=False
    )


# Shell completion answers to this variable whatever the program is called
# (`tfcluster`, `deploy.py`, `./deploy.py`): click would otherwise derive it
# from the name, and `_DEPLOY.PY_COMPLETE` cannot be set in a shell.
COMPLETE_VAR = "_TFCLUSTER_COMPLETE"

# When this process began (time.monotonic()), set where it is the command
# line (main): a job's start-up counts from there, imports included.
_STARTED: float | None = None


def main() -> None:
    global _STARTED
    _STARTED = time.monotonic() - process_age()
    # `kill` (SIGTERM) ends a command as Ctrl-C does: a sweep stops its
    # trials (which no `cancel` knows of), TensorBoard is stopped, a
    # followed job's tasks too.
    interrupted_by(signal.SIGTERM)
    check_arguments(sys.argv[1:])
    cli(prog_name=os.path.basename(sys.argv[0]) or "deploy.py", complete_var=COMPLETE_VAR)


if __name__ == "__main__":
    main()
