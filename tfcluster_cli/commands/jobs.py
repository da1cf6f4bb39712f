"""The commands that run something on the nodes: ``train`` (the built-in
trainer, or a sweep of it), ``run`` (the user's program as a distributed
job), ``exec`` (a command on every node), ``sweep`` (the user's program
over a parameter grid), ``cancel`` and ``logs``. Each parses its options,
calls ``Cluster`` and shows the job with tfcluster_cli/progress_view.py;
deploy.py adds them to its group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from infra.cluster.access import check_exec
from infra.cluster.api import Cluster
from tfcluster_cli import render
from tfcluster_cli.options import (
    dest_option,
    detach_option,
    env_option,
    env_pairs_option,
    job_option,
    pass_cluster,
    raw_option,
    recover_option,
    workdir_option,
)
from tfcluster_cli.progress_view import ExecView, TrainView, log_printer
from tfcluster_cli.sweeps import run_with_table, train_sweep
from trainer import catalog


@click.command(
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


@click.command(
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


@click.command("exec", context_settings={"allow_interspersed_args": False})
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


@click.command()
@pass_cluster
def cancel(cluster: Cluster) -> None:
    """Stop every task of the running job on purpose."""
    render.print_cancelled(*cluster.cancel())


@click.command()
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


@click.command(
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


COMMANDS = (train, run, exec_, sweep, cancel, logs)
