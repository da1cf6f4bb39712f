"""Data as the terminal shows it: the status table, ``up``'s plan and
outcome, ``down``'s plan, what the other commands did (stop, start,
autostop, cancel, tensorboard), a job's outcome (``report``'s tables are
reports.py). Names, addresses, parameters and metric names are the user's
or a node's text: every cell is ``Text`` (never markup) and no terminal
control gets through.

Pure: each function prints what it is given. What it shows is gathered by
the command (deploy.py) or the library (``Cluster.overview``), and a
failed job's error is the command's to raise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from infra.cluster.access import JobEnd
from infra.cluster.api import Cluster
from infra.cluster.lifecycle import DownPlan, UpPlan
from infra.cluster.overview import ClusterOverview, NodeView
from infra.jobs.progress import summary_text
from infra.jobs.run import JobResult
from infra.node.facts import GpuReport
from infra.providers.base import Pricing
from infra.text import node_text
from tfcluster_cli import consoles
from tfcluster_cli.provider_words import down_words

if TYPE_CHECKING:
    from infra.bucket.runs import BucketRun
    from infra.jobs.tensorboard import Board
    from infra.providers.base import Node
    from infra.setup.report import SetupReport
    from infra.spec.job import JobRecord


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
    pricing = provider if isinstance(provider, Pricing) else None
    for line in plan.lines(pricing.planned_node() if pricing else None):
        consoles.console.print(f"  {node_text(line)}", markup=False, soft_wrap=True)
    if pricing and (who := pricing.planned_identity()) is not None:
        consoles.console.print(f"  identity {node_text(who)}", markup=False, soft_wrap=True)
    if config.storage is not None:
        consoles.console.print(
            f"  bucket  {config.storage.url} (checked before anything is created)",
            markup=False,
            soft_wrap=True,
        )
    if not skip_setup and provider.capabilities().needs_setup:
        consoles.console.print("  setup   install + sync on every node")
    running = len(plan.create) + len(plan.start) + len(plan.wait) + len(plan.reuse)
    cost = pricing.planned_cost(running) if pricing and running else None
    if pricing and cost is not None:
        consoles.console.print(
            f"estimated cost once up: ${cost:.3f}/hour for {running} node(s) while running"
            f" ({pricing.price_source()})",
            markup=False,
            soft_wrap=True,
        )


def print_up_changes(plan: UpPlan) -> None:
    """What ``up`` is about to change (create, start, wait for), before it does."""
    if plan.changes:
        for line in plan.lines():
            if not line.startswith(("keep", "ensure")):
                consoles.console.print(node_text(line), style="cyan", markup=False)


def print_setup_event(node: str, what: str) -> None:
    """One step of a node's setup, as ``up`` reaches it."""
    consoles.console.print(f"  {node}: {node_text(what)}", markup=False)


def print_up_outcome(
    plan: UpPlan, nodes: Sequence[Node], report: SetupReport | None, overview: ClusterOverview
) -> None:
    """What ``up`` did: each node's setup, whether anything changed, the
    status (``overview``: as `up` left the cluster)."""
    if report is not None:
        for line in report.lines():
            consoles.console.print(f"  {node_text(line)}", markup=False)
    name = overview.name
    if not plan.changes and (report is None or not report.changed):
        consoles.console.print(
            f"{name}: all {len(nodes)} nodes already up; nothing to do", markup=False
        )
    else:
        consoles.console.print(f"[green]{escape(name)} is up[/]: {len(nodes)} nodes running")
    print_status(overview)


def print_down_plan(cluster: Cluster, plan: DownPlan) -> bool:
    """``down``'s plan in the provider's words; False: nothing to take down."""
    verb = down_words(cluster.provider.capabilities()).verb
    if not plan.delete and not plan.shared:
        consoles.console.print(f"nothing to {verb}", markup=False)
        return False
    consoles.console.print(f"down plan for {cluster.config.name}:", markup=False)
    for line in plan.lines(verb):
        consoles.console.print(f"  {node_text(line)}", markup=False, soft_wrap=True)
    return True


def print_down_done(cluster: Cluster) -> None:
    consoles.console.print(
        down_words(cluster.provider.capabilities()).done.format(name=cluster.config.name),
        style="green",
        markup=False,
        soft_wrap=True,
    )


def print_stopped(stopped: Sequence[str], overview: ClusterOverview) -> None:
    if stopped:
        consoles.console.print(f"[green]stopped[/] {escape(node_text(', '.join(stopped)))}")
    else:
        consoles.console.print("nothing running; nothing to stop")
    print_status(overview)


def print_started(nodes: Sequence[Node], overview: ClusterOverview) -> None:
    names = ", ".join(n.name for n in nodes)
    consoles.console.print(f"[green]running[/]: {escape(node_text(names))}")
    print_status(overview)


def print_autostop(after: int | None, nodes: Sequence[str]) -> None:
    from infra.config.durations import format_duration

    what = f"stop after {format_duration(after)} idle" if after else "off"
    consoles.console.print(f"autostop {what} on {', '.join(nodes)}", markup=False, soft_wrap=True)


def print_cancelled(record: JobRecord, stopped: Sequence[str]) -> None:
    if stopped:
        consoles.console.print(
            f"cancelled {node_text(record.run_id)}: stopped {node_text(', '.join(stopped))}",
            markup=False,
        )
    else:
        consoles.console.print(
            f"{node_text(record.run_id)}: no task was running; nothing to stop", markup=False
        )


def print_tensorboard_starting(node: str) -> None:
    consoles.console.print(f"starting TensorBoard on {node_text(node)}...", markup=False)


def print_tensorboard(board: Board) -> None:
    where = node_text(f"{board.node}:{board.logdir}")
    consoles.console.print(
        f"TensorBoard for {where} at {board.url} (Ctrl-C closes it)",
        markup=False,
        soft_wrap=True,
    )


def print_status(overview: ClusterOverview) -> None:
    """`status`'s table, the cost now, autostop and the last job, as given."""
    views, cost = overview.views, overview.hourly_usd
    # Cells are Text, never markup: names and addresses come from the config
    # and the provider.
    title = node_text(f"{overview.name} ({overview.provider})")
    table = Table(title=Text(title), title_justify="left")
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
        consoles.console.print(
            # A plug-in provider's Pricing says its source: data too.
            f"estimated cost now: ${cost:.3f}/hour ({node_text(str(overview.price_source))})",
            markup=False,
            soft_wrap=True,
        )
    if overview.idle is not None:
        consoles.console.print(overview.idle.text(), markup=False, soft_wrap=True)
    job = overview.last_job
    if job is not None:
        state = job_state(job.exit_code)
        consoles.console.print(
            f"last job: {node_text(job.run_id)}: {node_text(job.label)} ({state})",
            markup=False,
            soft_wrap=True,
        )


def print_job_end(end: JobEnd) -> None:
    """`logs --follow`'s last line: the followed job has ended (or had)."""
    code = "no exit code recorded" if end.exit_code is None else f"exit code {end.exit_code}"
    what = "has ended" if end.ended_now else "had ended already"
    consoles.console.print(
        f"job {node_text(end.run_id)} {what} ({code}): nothing more to follow",
        markup=False,
        soft_wrap=True,
    )


def job_state(code: int | None) -> str:
    """A recorded job's end, as `status` says it."""
    if code is None:
        return "running or detached"
    if code < 0:
        return "ended without an exit code: killed, or its node lost"
    if code == 130:
        return "exit code 130: interrupted or cancelled"
    return f"exit code {code}"


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
    """What `train` and `run` say once the job ended (or, detached,
    started). A failed job: only what its bucket holds (the caller raises
    its error, ``result.check()``, which says the rest)."""
    if result.exit_code is None:
        consoles.console.print(
            consoles.as_invoked(
                "[green]started[/]; follow with `deploy.py logs --follow`, "
                "bring results home with `deploy.py fetch`, stop it with `deploy.py cancel`"
            )
        )
        return
    if result.bucket is not None:
        consoles.console.print(result.bucket.text(), markup=False, soft_wrap=True)
    if not result.ok:
        return
    # The chief's "done" event was shown as it came; say it only if it got lost.
    if result.summary and not result.job.summary:
        consoles.console.print(f"[green]done[/]: {escape(summary_text(result.summary))}")
    if result.fetched:
        consoles.console.print(f"results: {result.destination}", markup=False, soft_wrap=True)
    else:  # the fetch failed (warned): the run folder is still on the chief's node
        consoles.console.print(
            consoles.as_invoked(
                "results: still on the chief's node; `deploy.py fetch --dest FOLDER`"
            )
        )


def params_text(params: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def print_upload_wait(count: int) -> None:
    """``down``/``stop`` wait for the nodes' uploads to the bucket first."""
    from infra.cluster.bucket import DRAIN_WAIT_S

    consoles.console.print(
        f"waiting for {count} upload(s) to the bucket to finish (at most {DRAIN_WAIT_S:.0f} s; "
        "Ctrl-C skips the wait)",
        markup=False,
        soft_wrap=True,
    )


def print_bucket_runs(name: str, runs: Sequence[BucketRun]) -> None:
    """``deploy.py runs``: the runs of cluster ``name`` in its bucket."""
    if not runs:
        consoles.console.print(f"no run of {name} in the bucket yet", markup=False)
        return
    table = Table(title=Text(f"runs of {name} in the bucket"), title_justify="left")
    for column in ("run", "started", "what ran", "status", "size"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for r in runs:
        status = r.status + (f" ({r.exit_code})" if r.exit_code not in (None, 0) else "")
        table.add_row(
            cell(r.run_id), cell(r.started_at or "-"), cell(node_text(r.label) or "-"),
            cell(status), cell(f"{r.size / 1e6:.1f} MB"),
        )  # fmt: skip
    consoles.console.print(table)
