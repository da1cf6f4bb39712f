"""Provider ``ssh``: machines that already exist (``hosts`` in cluster.yaml).

There is nothing to create, start, stop or delete: the nodes are the hosts
listed in cluster.yaml, reached over SSH with the cluster's key (the per-
cluster key, or ``ssh.key_file``), whose public half the user authorizes on
each host once (``python -m tfcluster_cli.compose public-key --config FILE`` prints
it; ``make cluster-up`` does it for the docker-compose cluster).

State: a host whose sshd port accepts a TCP connection is RUNNING; one that
does not (refused, timed out, unknown name) is PENDING, with the reason as
its status. Listing probes every host in parallel with a short timeout, so
``status`` shows at once which machines are down, and ``up`` waits for a
rebooting host (lifecycle's wait for running) instead of failing at once.

``create_nodes`` and ``start_nodes`` only wait for the hosts to answer;
``stop_nodes`` refuses (``Capabilities.cannot_stop``: they are not ours to stop);
``terminate_nodes`` (``down``) stops whatever tfcluster tasks still run on
the reachable hosts and leaves the machines and their files alone.

Each cluster keeps its files in a folder of its own on the hosts,
``<setup.remote_dir>/<name>-<id>`` (``base.remote_root``): several
clusters may share a login, and none sees, overwrites, cancels or stops another's.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Sequence

from infra.config.loader import ClusterConfig
from infra.errors import ProviderError, RemoteError, StateError
from infra.node import commands
from infra.providers.base import (
    Capabilities,
    Node,
    NodeProvider,
    NodeState,
    login_key,
    remote_root,
)
from infra.transport.base import Transport
from infra.transport.fanout import fan_out

log = logging.getLogger("tfcluster")

# Listing must stay quick even with a host down: the probe's own timeout.
PROBE_TIMEOUT_S = 3.0

# What a probe's status means, said plainly for error lines.
_PLAINLY = {
    "REFUSED": "connection refused (the machine is up, but nothing listens on that port)",
    "TIMEOUT": "no answer (the machine is down, or a firewall drops the port)",
    "UNKNOWN-HOST": "unknown host name",
}


def probe(host: str, port: int, timeout: float) -> str | None:
    """None when ``host:port`` accepts a TCP connection, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.gaierror:
        return "UNKNOWN-HOST"
    except ConnectionRefusedError:
        return "REFUSED"
    except TimeoutError:
        return "TIMEOUT"
    except OSError as exc:
        return f"UNREACHABLE ({exc.strerror or exc})"


class SshProvider(NodeProvider):
    """Existing machines reached over SSH."""

    kind = "ssh"

    def capabilities(self) -> Capabilities:
        return Capabilities(
            cannot_stop="provider ssh cannot stop its nodes (they are not ours to stop)",
            cannot_self_stop=(
                "provider ssh: these machines are not ours to power off (someone else may "
                "use them, and nothing would start them again)"
            ),
            # The machines are the user's: `down` stops tfcluster's tasks on
            # them and leaves the machines and their files alone; a host that
            # does not answer says why (refused, no answer), and what to do is
            # the user's: start the machine or fix its address.
            existing_hosts=True,
        )

    @classmethod
    def config_problem(cls, config: ClusterConfig) -> tuple[tuple[str, ...], str] | None:
        """Every node needs an entry in ``hosts``: there is nothing to create."""
        if missing := [n for n in config.nodes if n not in config.hosts]:
            return ("hosts",), (
                f"provider ssh needs an address for every node; missing {', '.join(missing)}"
            )
        return None

    def prepare(self) -> None:
        # The per-cluster key must exist before anything logs in.
        login_key(self.config, self.state)

    def non_terminated_nodes(self) -> list[Node]:
        hosts = {name: self.config.hosts[name] for name in self.config.nodes}
        timeout = min(self.config.ssh.connect_timeout, PROBE_TIMEOUT_S)
        probes = fan_out(lambda name: probe(hosts[name].address, hosts[name].port, timeout), hosts)
        nodes = []
        for name, host in hosts.items():
            problem = probes.results[name]
            nodes.append(
                Node(
                    name=name,
                    state=NodeState.RUNNING if problem is None else NodeState.PENDING,
                    status="REACHABLE" if problem is None else problem,
                    internal_ip=host.task_host(),
                    external_ip=host.address,
                    ssh_host=host.address,
                    ssh_port=host.port,
                    machine_type="existing host",
                )
            )
        return nodes

    def _wait_reachable(self, names: Sequence[str]) -> None:
        """Wait (ssh.boot_timeout) until the hosts accept TCP on their sshd port."""
        deadline = time.monotonic() + self.config.ssh.boot_timeout
        while True:
            down = {
                n.name: n.status
                for n in self.non_terminated_nodes()
                if n.name in names and n.state is not NodeState.RUNNING
            }
            if not down:
                return
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"no SSH answer after {self.config.ssh.boot_timeout:g} s (ssh.boot_timeout): "
                    + "; ".join(
                        f"{n} at {self._where(n)}: {_PLAINLY.get(why, why.lower())}"
                        for n, why in sorted(down.items())
                    ),
                    hint="start those machines (or fix hosts.<node>.address/port), "
                    "then run `deploy.py up` again",
                )
            time.sleep(2.0)

    def _where(self, name: str) -> str:
        host = self.config.hosts[name]
        address = f"[{host.address}]" if ":" in host.address else host.address
        return f"{address}:{host.port}"

    def create_nodes(self, names: Sequence[str]) -> None:
        # Nothing to create: the machines exist. Wait for them to answer.
        self._wait_reachable(names)

    def wait_nodes(self, names: Sequence[str]) -> None:
        # A host that does not answer is listed PENDING: wait ssh.boot_timeout
        # for it (a reboot), not the cloud's operation timeout.
        self._wait_reachable(names)

    def start_nodes(self, names: Sequence[str]) -> None:
        self._wait_reachable(names)

    def stop_nodes(self, names: Sequence[str]) -> None:
        raise StateError("provider ssh cannot stop its nodes: they are not ours to stop")

    def terminate_nodes(self, names: Sequence[str]) -> None:
        """Stop tfcluster's tasks on the reachable hosts; leave the machines."""
        reachable = [n for n in self.non_terminated_nodes() if n.name in names]
        reachable = [n for n in reachable if n.state is NodeState.RUNNING]
        if not reachable:
            return
        # Every task name a job of this cluster can have (task files are
        # named type-index); stop_tasks skips the ones not running.
        names_of_tasks = ["chief-0"]
        names_of_tasks += [f"ps-{i}" for i in range(len(self.config.roles.ps))]
        names_of_tasks += [f"worker-{i}" for i in range(len(self.config.roles.worker))]
        with self.transport(reachable) as transport:
            scripts = {
                node: commands.stop_tasks(transport.layout(node), names_of_tasks)
                for node in transport.nodes
            }
            try:
                transport.run_all(scripts, timeout=60)
            except RemoteError as exc:
                log.warning("could not stop the tasks everywhere: %s", exc)

    def transport(self, nodes: Sequence[Node]) -> Transport:
        # Imported here: validating cluster.yaml asks this class about its
        # hosts, which needs no SSH stack.
        from infra.transport.ssh import SshTarget, SshTransport

        key_file, _ = login_key(self.config, self.state)
        targets = []
        for node in nodes:
            host = self.config.hosts.get(node.name)
            address = node.ssh_host or (host.address if host else None)
            if address is None:
                raise RemoteError(f"{node.name}: no SSH address known (hosts.{node.name})")
            port = node.ssh_port if node.ssh_host else (host.port if host else 22)
            targets.append(SshTarget(node.name, address, port))
        return SshTransport(
            targets,
            config=self.config,
            state=self.state,
            key_file=key_file,
            root=remote_root(self),
        )
