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
import threading
import time
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.text import Text

from infra.cluster import Cluster
from infra.config import ClusterConfig, default_config, load_config
from infra.errors import ConfigError, JobFailed
from infra.progress import describe, parse_line
from infra.text import node_text
from tfcluster_cli.consoles import console, err_console, setup_logging
from tfcluster_cli.group import TfclusterGroup
from tfcluster_cli.options import (
    duration_option,
    env_option,
    job_option,
    recover_option,
    workdir_option,
)
from tfcluster_cli.progress_view import Null, SweepView, TrainView
from tfcluster_cli.render import (
    print_job_outcome,
    print_run_comparison,
    print_status,
    print_sweep_report,
    print_up_plan,
)
from trainer import catalog
from trainer.progress import process_age

pass_cluster = click.make_pass_decorator(Cluster)


def _version() -> str:
    """The installed tfcluster's version (pyproject's, once `pip install -e .`
    or `make` ran); a bare checkout run without installing says so."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tfcluster")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


@click.group(cls=TfclusterGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    _version(), "--version", "-V", prog_name="tfcluster", message="%(prog)s %(version)s"
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
    config = cluster.config
    if dry_run:
        print_up_plan(cluster, plan, skip_setup)
        return
    if plan.changes:
        for line in plan.lines():
            if not line.startswith(("keep", "ensure")):
                console.print(node_text(line), style="cyan", markup=False)
    with console.status("bringing the cluster up...") if console.is_terminal else Null():
        nodes, report = cluster.up(
            plan,
            setup=not skip_setup,
            autostop="off" if autostop_text is not None and after is None else after,
            on_setup_event=lambda node, what: console.print(
                f"  {node}: {node_text(what)}", markup=False
            ),
        )
    if report is not None:
        for line in report.lines():
            console.print(f"  {node_text(line)}", markup=False)
    if not plan.changes and (report is None or not report.changed):
        console.print(
            f"{config.name}: all {len(nodes)} nodes already up; nothing to do", markup=False
        )
    else:
        console.print(f"[green]{escape(config.name)} is up[/]: {len(nodes)} nodes running")
    print_status(cluster)


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
    print_status(cluster, all_gpus=all_gpus)


@cli.command()
@pass_cluster
def stop(cluster: Cluster) -> None:
    """Stop the nodes: no compute cost, disks kept."""
    stopped = cluster.stop()
    if stopped:
        console.print(f"[green]stopped[/] {escape(node_text(', '.join(stopped)))}")
    else:
        console.print("nothing running; nothing to stop")
    print_status(cluster)


@cli.command()
@pass_cluster
def start(cluster: Cluster) -> None:
    """Start stopped nodes (their external IPs change)."""
    nodes = cluster.start()
    console.print(f"[green]running[/]: {escape(node_text(', '.join(n.name for n in nodes)))}")
    print_status(cluster)


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
    nodes = cluster.set_autostop(after)
    from infra.autostop import format_duration

    what = f"stop after {format_duration(after)} idle" if after else "off"
    console.print(f"autostop {what} on {', '.join(nodes)}", markup=False, soft_wrap=True)


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
    if not plan.delete and not plan.shared:
        console.print(f"nothing to {provider.down_verb}", markup=False)
        return
    console.print(f"down plan for {cluster.config.name}:", markup=False)
    for line in plan.lines(provider.down_verb):
        console.print(f"  {node_text(line)}", markup=False, soft_wrap=True)
    if dry_run:
        return
    if not yes and not click.confirm(provider.down_question, default=False):
        console.print("cancelled: nothing changed", markup=False)
        raise click.exceptions.Exit(EXIT_CANCELLED)
    cluster.down(plan)
    console.print(
        provider.down_done.format(name=cluster.config.name),
        style="green",
        markup=False,
        soft_wrap=True,
    )


# -- jobs ------------------------------------------------------------------------

# infra/recovery.py: on by default where a node is a Spot VM.


@cli.command(
    epilog="""\b
Examples:
  deploy.py train --steps 200
  deploy.py train -- --epochs 1                        # trainer flags after --
  deploy.py train --mode average -- --average-every 5""",
)
@job_option("--model", "model", type=click.Choice(catalog.MODELS))
@job_option("--mode", "mode", type=click.Choice(catalog.MODE_NAMES))
@job_option("--steps", "steps", type=click.IntRange(min=1))
@job_option("--batch-size", "batch_size", type=click.IntRange(min=1))
@job_option("--learning-rate", "learning_rate", type=click.FloatRange(min=0, min_open=True))
@job_option("--checkpoint-every", "checkpoint_every", type=click.IntRange(min=1))
@job_option("--data-dir", "data_dir", help="MNIST folder on the nodes.")
@click.option("--resume", is_flag=True, help="Continue the last job from its checkpoint.")
@click.option("--detach", is_flag=True, help="Start the job and return at once.")
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), help="Where results go.")
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
        _train_sweep(cluster, sweep_params, trials, per_node or 1, resume, detach, dest, overrides)
        return
    view = TrainView(detach)
    result = cluster.train(
        resume=resume, detach=detach, dest=dest, recover=not no_recover, reporter=view,
        **overrides,
    )  # fmt: skip
    print_job_outcome(result)


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
@click.option(
    "--env",
    "env_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="An environment variable for every task (repeatable; beside cluster.yaml's job.env).",
)
@workdir_option
@click.option("--detach", is_flag=True, help="Start the job and return at once.")
@click.option(
    "--dest",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the chief's TFCLUSTER_RUN_DIR comes home (default runs/<cluster>/<run id>).",
)
@recover_option
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
    view = TrainView(detach, echo=True)
    result = cluster.run_program(
        command, ps=not no_ps, env=env, workdir=workdir, detach=detach, dest=dest,
        recover=not no_recover, reporter=view,
    )  # fmt: skip
    print_job_outcome(result)


@cli.command("exec", context_settings={"allow_interspersed_args": False})
@click.option(
    "--node",
    "nodes",
    multiple=True,
    metavar="NODE",
    help="Only this node (repeatable); default every running node.",
)
@workdir_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@pass_cluster
def exec_(
    cluster: Cluster, nodes: tuple[str, ...], workdir: Path | None, command: tuple[str, ...]
) -> None:
    """Run COMMAND on every node (or the --node ones) in the working folder,
    e.g. `exec -- nvidia-smi`, `exec -- pip list`. Output lines are prefixed
    with the node's name; exits 0 only if COMMAND succeeded everywhere."""
    folder = cluster.workdir(workdir)
    lock = threading.Lock()

    def show(node: str, line: str) -> None:
        with lock:
            console.print(f"{node} | {line}", markup=False, highlight=False, soft_wrap=True)

    codes = cluster.exec(command, list(nodes) or None, workdir=folder, on_line=show)
    failed = {node: code for node, code in codes.items() if code != 0}
    if failed:
        raise JobFailed(
            f"failed on {len(failed)} of {len(codes)} node(s): "
            + ", ".join(f"{node} exit {code}" for node, code in failed.items()),
            exit_code=next(iter(failed.values())),
        )


@cli.command()
@pass_cluster
def cancel(cluster: Cluster) -> None:
    """Stop every task of the running job on purpose."""
    record, stopped = cluster.cancel()
    if stopped:
        console.print(
            f"cancelled {record.run_id}: stopped {node_text(', '.join(stopped))}", markup=False
        )
    else:
        console.print(f"{record.run_id}: no task was running; nothing to stop", markup=False)


@cli.command()
@click.argument("node", required=False)
@click.option("--follow", "-f", is_flag=True, help="Keep following until Ctrl-C.")
@click.option("--lines", "-n", default=50, show_default=True, type=click.IntRange(min=0))
@click.option(
    "--raw", is_flag=True, help="The chief's progress events as written (@tfcluster {json})."
)
@pass_cluster
def logs(cluster: Cluster, node: str | None, follow: bool, lines: int, raw: bool) -> None:
    """Task logs of every node (or one), each line prefixed with node/task.
    The chief's progress events are shown as sentences (`--raw`: as JSON).
    Before any job, or with no node running: one line saying so, exit 3."""

    def show(node_name: str, task: str, line: str) -> None:
        event = None if raw else parse_line(line)
        text = line if event is None else describe(event)
        console.print(Text.assemble((f"{node_name}/{task}", "cyan"), " ", text), soft_wrap=True)

    try:
        cluster.logs(node, lines=lines, follow=follow, on_line=show)
    except KeyboardInterrupt:
        return


@cli.command()
@click.argument("run_id", metavar="[RUN]", required=False)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=6006,
    show_default=True,
    help="The local port of the tunnel (taken or 0: any free one).",
)
@pass_cluster
def tensorboard(cluster: Cluster, run_id: str | None, port: int) -> None:
    """TensorBoard on a job's run folder (default: the last job's), also
    while it trains: it runs on the chief's node, reached through an SSH
    tunnel to a port here (local cluster: directly). The URL is printed;
    Ctrl-C closes it and stops it on the node."""
    # A closed terminal stops it too: nothing else would (a job, by
    # contrast, is recorded, and goes on for `logs` and `fetch`).
    _interrupted_by(signal.SIGHUP)

    def starting(node: str) -> None:
        console.print(f"starting TensorBoard on {node}...", markup=False)

    with cluster.tensorboard(run_id, local_port=port, on_starting=starting) as (board, wait):
        console.print(
            f"TensorBoard for {board.node}:{board.logdir} at {board.url} (Ctrl-C closes it)",
            markup=False,
            soft_wrap=True,
        )
        try:
            wait()
        except KeyboardInterrupt:
            console.print("closed TensorBoard", markup=False)


@cli.command()
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), help="Where to put it.")
@pass_cluster
def fetch(cluster: Cluster, dest: Path | None) -> None:
    """Bring the last job's run folder home (metrics, summary, plots, checkpoints)."""
    record, destination = cluster.fetch(dest)
    console.print(f"fetched {record.run_id} to {destination}", markup=False)


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
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where the speedup / time-to-accuracy plot goes (default report.png; for a "
    "sweep folder, report.png inside it).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable rows.")
@click.option("--metric", help="A sweep's metric to rank the trials by (default test accuracy).")
def report(run_dirs: tuple[str, ...], plot: Path | None, as_json: bool, metric: str | None) -> None:
    """Compare runs: training time, examples/s, speedup vs 1 worker, accuracy or PSNR.
    Given a sweep folder: its trials, the best one marked, and the metric
    against each parameter."""
    from infra.report import ReportError, compute_rows, load_runs, write_plot
    from infra.sweep_report import is_sweep

    if len(run_dirs) == 1 and is_sweep(run_dirs[0]):
        print_sweep_report(Path(run_dirs[0]), plot, as_json, metric)
        return
    plot = plot or Path("report.png")
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
@click.option(
    "--env",
    "env_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="An environment variable for every trial (repeatable).",
)
@workdir_option
@click.option(
    "--dest",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the sweep folder goes (default runs/<cluster>/<sweep id>).",
)
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
    from infra.sweep_spec import command_spec, parse_params

    spec = command_spec(
        command,
        parse_params(params),
        trials=trials,
        env={**cluster.config.job.env, **env_option(env_pairs)},
    )
    _run_sweep(cluster, spec, per_node=per_node, dest=dest, workdir=cluster.workdir(workdir))


def _run_sweep(
    cluster: Cluster, spec: Any, *, per_node: int, dest: Path | None, workdir: Path | None
) -> None:
    """Run a sweep with a live table of its trials, then say how it went."""
    from infra.sweep import run_sweep

    # A closed terminal stops the trials too: no record of them is kept
    # for `cancel` or `status` (a job, by contrast, goes on for `logs`).
    _interrupted_by(signal.SIGHUP)
    destination = cluster.local_run_dir(spec.sweep_id, dest)
    view = SweepView(spec)
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
    console.print(view.table(sweep_run.trials, final=True))
    failed = [t for t in sweep_run.trials if t.state != "done"]
    console.print(f"results: {destination}", markup=False, soft_wrap=True)
    if failed:
        raise JobFailed(
            f"{len(failed)} of {len(sweep_run.trials)} trial(s) failed: "
            + ", ".join(
                f"{t.name} ({'exit ' + str(t.exit_code) if t.exit_code is not None else t.note})"
                for t in failed
            ),
            exit_code=1,
            hint="`deploy.py logs` shows each trial's log (trial-N)",
        )
    console.print(
        f"[green]done[/]: {len(sweep_run.trials)} trial(s); "
        f"compare them with `deploy.py report {escape(str(destination))}`"
    )


def _train_sweep(
    cluster: Cluster,
    sweep_params: tuple[str, ...],
    trials: int | None,
    per_node: int,
    resume: bool,
    detach: bool,
    dest: Path | None,
    overrides: dict[str, Any],
) -> None:
    from infra.sweep_spec import parse_params, trainer_spec

    if not sweep_params:
        raise ConfigError("--trials and --per-node go with --sweep FLAG=V1,V2,...")
    if resume or detach:
        raise ConfigError("--sweep runs to the end: no --resume or --detach with it")
    if overrides.get("mode") not in (None, "single"):
        raise ConfigError(
            f"--mode {overrides['mode']}: each trial of a sweep is one process (mode single); "
            "leave --mode out"
        )
    overrides["mode"] = "single"
    params = parse_params(sweep_params, option="--sweep")
    base = cluster.train_spec(**overrides).program.argv
    spec = trainer_spec(base, params, trials=trials)
    _run_sweep(cluster, spec, per_node=per_node, dest=dest, workdir=None)


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


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    global _STARTED
    _STARTED = time.monotonic() - process_age()
    # `kill` (SIGTERM) ends a command as Ctrl-C does: a sweep stops its
    # trials (which no `cancel` knows of), TensorBoard is stopped, a
    # followed job's tasks too. Where it is ignored, it stays ignored.
    _interrupted_by(signal.SIGTERM)
    for i, arg in enumerate(sys.argv[1:], 1):
        # Bytes that are not UTF-8 arrive as surrogates (surrogateescape):
        # the SSH library cannot send them, and stopped a sweep or a run
        # with a traceback once the command was on its way to a node.
        try:
            arg.encode()
        except UnicodeEncodeError:
            shown = arg.encode(errors="surrogateescape").decode(errors="backslashreplace")
            err_console.print(
                f"error: argument {i} ({node_text(shown[:60])}) is not UTF-8 text; "
                "write it as UTF-8 (check the terminal's locale)",
                style="red", markup=False, soft_wrap=True,
            )  # fmt: skip
            sys.exit(ConfigError.exit_code)
    cli(prog_name=os.path.basename(sys.argv[0]) or "deploy.py", complete_var=COMPLETE_VAR)


def _interrupted_by(sig: signal.Signals) -> None:
    # Only the main thread may set a handler (a test may run us in another).
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(sig) is signal.SIG_DFL:
        signal.signal(sig, _interrupt)


if __name__ == "__main__":
    main()
