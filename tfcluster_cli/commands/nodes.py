"""The commands of the nodes' life and access: ``up``, ``status``,
``stop``, ``start``, ``autostop``, ``down``, ``ssh`` and ``forget-host``.
Each parses its options, calls ``Cluster`` and renders with
tfcluster_cli/render.py; deploy.py adds them to its group.
"""

from __future__ import annotations

import json

import click

from infra.cluster.api import Cluster
from tfcluster_cli import render
from tfcluster_cli.consoles import console
from tfcluster_cli.options import duration_option, pass_cluster
from tfcluster_cli.progress_view import Null
from tfcluster_cli.provider_words import down_words


@click.command()
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


@click.command()
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


@click.command()
@pass_cluster
def stop(cluster: Cluster) -> None:
    """Stop the nodes: no compute cost, disks kept (pending uploads to the
    bucket first)."""
    stopped = cluster.stop(on_wait=render.print_upload_wait)
    render.print_stopped(stopped, cluster.overview())


@click.command()
@pass_cluster
def start(cluster: Cluster) -> None:
    """Start stopped nodes (their external IPs change)."""
    nodes = cluster.start()
    render.print_started(nodes, cluster.overview())


# `down` answered "n": nothing was changed, and a script that runs `down`
# without --yes can tell that from success.
EXIT_CANCELLED = 1


@click.command("autostop")
@click.argument("duration", metavar="DURATION|off")
@pass_cluster
def autostop_(cluster: Cluster, duration: str) -> None:
    """Stop every node once no job task has run on it for DURATION (45s,
    30m, 2h), or `off`. The nodes stop themselves (a guest shutdown: GCE
    keeps the disks and bills no compute); `start` brings them back."""
    after = duration_option("autostop", duration)
    render.print_autostop(after, cluster.set_autostop(after))


@click.command()
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


@click.command()
@click.argument("node")
@pass_cluster
def ssh(cluster: Cluster, node: str) -> None:
    """Open a shell on NODE."""
    shell = cluster.shell(node)
    if shell.folder is not None:
        console.print(f"{node} is a local folder: {shell.folder}", markup=False)
        return
    raise click.exceptions.Exit(shell.exit_code)


@click.command("forget-host")
@click.argument("node")
@pass_cluster
def forget_host(cluster: Cluster, node: str) -> None:
    """Forget NODE's pinned SSH host key (after you re-created it on purpose)."""
    cluster.forget_host(node)
    console.print(
        f"forgot the host key of {node}; the next connection pins the new one", markup=False
    )


COMMANDS = (up, status, stop, start, autostop_, down, ssh, forget_host)
