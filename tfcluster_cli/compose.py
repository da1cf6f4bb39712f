"""``python -m tfcluster_cli.compose``: what the node image's build and the
docker-compose cluster's make targets ask of tfcluster (docker/, mk/):

* ``marker --config FILE``: the install marker a node set up for that config
  carries (the node image's ``BAKE_VENV=1`` build writes it, so ``up`` finds
  nothing to install there); ``plan --config FILE`` (or ``marker plan``)
  prints the whole install plan as JSON;
* ``public-key --config FILE``: the public key line that logs in to that
  cluster's nodes (made on first use); ``make cluster-up`` authorizes it on
  the containers;
* ``forget-host --config FILE [NODE]``: drop the pinned host keys of the
  cluster's hosts (the containers were made again).

A command line beside deploy.py's for scripts, not for users: the library
parts are infra's (``install_plan``, ``cluster_key``, ``forget_host``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict

import click

from infra.config.loader import ClusterConfig, load_config
from infra.errors import ConfigError, StateError, TfclusterError
from infra.setup.nodes import install_plan
from infra.state.folder import ClusterState
from infra.state.keys import cluster_key
from infra.text import node_text
from infra.transport.host_keys import forget_host, known_hosts_name

_CONFIG = click.option("--config", "config_path", required=True, help="the cluster.yaml")


def _load(config_path: str) -> ClusterConfig:
    return load_config(config_path)


@click.group()
def compose() -> None:
    """What the node image's build and the compose cluster ask of tfcluster."""


@compose.command()
@click.argument("what", type=click.Choice(["marker", "plan"]), default="marker", required=False)
@_CONFIG
def marker(what: str, config_path: str) -> None:
    """The install marker of a node set up for the config (or the plan)."""
    plan = install_plan(_load(config_path))
    if what == "marker":
        click.echo(plan.fingerprint)
        return
    data = asdict(plan)
    data["wheelhouse"] = str(plan.wheelhouse) if plan.wheelhouse else None
    data["fingerprint"] = plan.fingerprint
    click.echo(json.dumps(data, indent=2))


@compose.command("plan")
@_CONFIG
@click.pass_context
def plan_(ctx: click.Context, config_path: str) -> None:
    """The whole install plan for the config, as JSON (the old
    ``python -m infra.setup plan``)."""
    ctx.invoke(marker, what="plan", config_path=config_path)


@compose.command("public-key")
@_CONFIG
def public_key(config_path: str) -> None:
    """The public key line that logs in to the cluster's nodes."""
    config = _load(config_path)
    state = ClusterState(config.name)
    _, line = cluster_key(config.ssh.key_file, state.key_file, f"tfcluster-{config.name}")
    click.echo(line)


@compose.command("forget-host")
@_CONFIG
@click.argument("node", required=False)
def forget(config_path: str, node: str | None) -> None:
    """Drop the pinned host key of NODE (default: every node with a host)."""
    config = _load(config_path)
    state = ClusterState(config.name)
    # A typo'd NODE is refused, as `deploy.py forget-host` refuses it: a
    # silent success would leave the stale key pinned.
    if node is not None and node not in config.nodes:
        raise ConfigError(f"{node} is not a node of {config.name}")
    if node is not None and node not in config.hosts:
        # Its key is pinned under the machine's name, not an address
        # (gce, local): `deploy.py forget-host` knows where.
        raise ConfigError(
            f"{node} has no hosts: address in {config_path}; `deploy.py forget-host {node}` "
            "forgets a key pinned any other way"
        )
    for name in [node] if node else list(config.nodes):
        host = config.hosts.get(name)
        if host is None:
            continue
        if forget_host(state.known_hosts, host.address, host.port):
            pinned = known_hosts_name(host.address, host.port)
            click.echo(f"{name}: forgot the host key of {pinned}")


def _error(message: str) -> None:
    # Paths and names are the caller's text: no terminal control, as deploy.py's errors.
    click.echo(f"error: {node_text(message)}", err=True)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        compose.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # no command: the help, as it is
        click.echo(exc.format_message(), err=True)
        return 2
    except click.ClickException as exc:
        _error(exc.format_message())
        return 2
    # One line and the class's exit code, as deploy.py says them.
    except TfclusterError as exc:
        _error(str(exc))
        return exc.exit_code
    # The state folder (the key, known_hosts) cannot be written there.
    except OSError as exc:
        _error(str(exc))
        return StateError.exit_code
    except click.exceptions.Abort:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
