#!/usr/bin/env python3
"""tfcluster's command line: parse, call ``infra``, render.

Every command works on one cluster: ``--config cluster.yaml`` (or
$TFCLUSTER_CONFIG); with neither, the embedded local cluster (processes on
this machine). Expected errors are one red line and a distinct exit code
(see ``infra/errors.py``); anything else is a bug, logged with its
traceback to a file whose path is printed.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import click

from infra.cluster.api import Cluster
from infra.config.loader import ClusterConfig, default_config, load_config
from tfcluster_cli.commands import jobs, nodes, runs
from tfcluster_cli.consoles import setup_logging
from tfcluster_cli.group import TfclusterGroup
from tfcluster_cli.program import check_arguments, interrupted_by, version
from trainer.loop.progress import process_age


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


# The commands, a module per group (tfcluster_cli/commands/); `deploy.py
# --help` lists them in the group's order (tfcluster_cli/group.py).
for command in (*nodes.COMMANDS, *jobs.COMMANDS, *runs.COMMANDS):
    cli.add_command(command)

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
