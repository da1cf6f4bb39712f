"""The code a job started with, so that a restarted job runs that code.

A Spot recovery (infra/jobs/recovery.py) restarts a job minutes or hours after
its launch. The working folder here may have been edited meanwhile (the
user goes on working), and a checkpoint must not be resumed under other
code. So a recovery never syncs again: the nodes' copies are the launch's
(a preempted VM keeps its disk). To know they still are, every launch
records on each node what it synced (``record``: size, mtime and path of
every synced file, beside the run id), and before a recovery restarts the
job each node checks those files against the record (``check``): a file
changed or gone since (an ``exec``'s sync in between, a node rebuilt) ends
the recovery with one line instead of a job under mixed code.

Where the nodes run this machine's files (the local cluster) there is no
copy to keep: nothing is recorded, and nothing is checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from infra.config.loader import ClusterConfig
from infra.errors import StateError
from infra.setup.commands import check_code_command, record_code_command
from infra.setup.facts import parse_code_check
from infra.setup.sync_items import sync_items
from infra.text import node_text
from infra.transport.base import Transport


def synced_paths(
    transport: Transport, node: str, config: ClusterConfig, workdir: Path | None
) -> list[str]:
    """The node's paths a launch syncs: the code, ``setup.sync``, the
    working folder (of a user's program)."""
    layout = transport.layout(node)
    paths = [item.remote for item in sync_items(config, layout)]
    if workdir is not None:
        paths.append(transport.workdir(node, workdir))
    return paths


def record(
    transport: Transport, config: ClusterConfig, run_id: str, workdir: Path | None
) -> None:
    """On every node of ``transport``, what ``run_id`` starts with."""
    if not transport.copies_files:
        return
    transport.check_all(
        {
            node: record_code_command(
                transport.layout(node), run_id, synced_paths(transport, node, config, workdir)
            )
            for node in transport.nodes
        },
        what="recording the job's code",
        timeout=120,
    )


def check(transport: Transport, run_id: str, *, hint: str) -> None:
    """A StateError (one line, naming a node and a file) unless every node
    still has the files ``run_id`` started with."""
    if not transport.copies_files:
        return
    results = transport.check_all(
        {node: check_code_command(transport.layout(node), run_id) for node in transport.nodes},
        what="checking the job's code",
        timeout=120,
    )
    for node in sorted(results):
        found = parse_code_check(results[node].stdout)
        if not found.known:
            raise StateError(
                f"{node} has no record of the code {run_id} started with; "
                "it is not restarted under code that may differ",
                hint=hint,
            )
        if found.changed:
            raise StateError(
                f"the code on {node} changed since {run_id} started "
                f"({_files(found.files, found.changed)}); it is not restarted under other code",
                hint=hint,
            )


def _files(files: Sequence[str], count: int) -> str:
    shown = ", ".join(node_text(f)[:80] for f in files)
    return shown + (f" and {count - len(files)} more" if count > len(files) else "")
