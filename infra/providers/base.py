"""The provider interface: where a cluster's nodes come from.

A provider answers "which of this cluster's nodes exist, in what state, at
which addresses" and changes that (create, start, stop, terminate). It does
not know about TensorFlow or SSH commands: the lifecycle module plans with
it, and a ``Transport`` (``transport()``) runs commands on the nodes.

Node states, as every provider reports them (``NodeState``):

* ``pending``   being created or started (GCE PROVISIONING, STAGING, REPAIRING);
                wait for it.
* ``running``   up; it has addresses and costs money by the hour.
* ``stopping``  on its way to ``stopped`` (GCE STOPPING, SUSPENDING).
* ``stopped``   exists with its disk, compute not billed (GCE TERMINATED,
                SUSPENDED). ``start`` brings it back, with new external IPs.
* terminated    gone: not listed by ``non_terminated_nodes`` at all.

The provider's own view of a node (labels on GCE, the hosts list for ssh,
the process table for local) is the truth; the local state file is a cache.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infra.config import ClusterConfig
from infra.state import ClusterState

if TYPE_CHECKING:
    from infra.transport import Transport


class NodeState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True)
class Node:
    """One node as the provider sees it now."""

    name: str
    state: NodeState
    # The provider's own word for the state (GCE: RUNNING, TERMINATED, ...).
    status: str
    internal_ip: str | None = None
    external_ip: str | None = None
    # Where this machine reaches the node's sshd; for gce the external IP.
    ssh_host: str | None = None
    ssh_port: int = 22
    zone: str | None = None
    machine_type: str | None = None
    # For example "1 x nvidia-tesla-t4"; None when the node has no GPU.
    accelerators: str | None = None
    preemptible: bool = False
    labels: dict[str, str] = field(default_factory=dict)


class NodeProvider(ABC):
    """Creates, lists, starts, stops and terminates the nodes of one cluster.

    Every method that changes state is idempotent for nodes already in the
    target state, and works on several nodes in parallel: four nodes must
    take about as long as one.
    """

    #: "gce" | "ssh" | "local"
    kind: str = ""

    def __init__(self, config: ClusterConfig, state: ClusterState) -> None:
        self.config = config
        self.state = state

    # -- what exists -----------------------------------------------------------

    @abstractmethod
    def non_terminated_nodes(self) -> list[Node]:
        """Every existing node of this cluster (any state but terminated)."""

    def node(self, name: str) -> Node | None:
        return next((n for n in self.non_terminated_nodes() if n.name == name), None)

    def internal_ip(self, name: str) -> str | None:
        node = self.node(name)
        return node.internal_ip if node else None

    def external_ip(self, name: str) -> str | None:
        node = self.node(name)
        return node.external_ip if node else None

    # -- changes ---------------------------------------------------------------

    def prepare(self) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """Create what the cluster shares (firewall rule, SSH key); idempotent."""

    def shared_resources(self) -> list[str]:
        """Human names of what ``prepare`` creates and ``release`` deletes."""
        return []

    @abstractmethod
    def create_nodes(self, names: Sequence[str]) -> None:
        """Create these nodes, in parallel, and wait until they are running."""

    @abstractmethod
    def start_nodes(self, names: Sequence[str]) -> None:
        """Start these stopped nodes and wait until they are running."""

    @abstractmethod
    def stop_nodes(self, names: Sequence[str]) -> None:
        """Stop these nodes (disks kept) and wait until they are stopped."""

    @abstractmethod
    def terminate_nodes(self, names: Sequence[str]) -> None:
        """Delete these nodes; a node already gone is not an error."""

    def release(self) -> None:  # noqa: B027 - optional hook
        """Delete what ``prepare`` created; already gone is not an error."""

    # -- reaching the nodes --------------------------------------------------------

    @abstractmethod
    def transport(self, nodes: Sequence[Node]) -> Transport:
        """How to run commands on these (running) nodes."""

    def task_port(self, node: str, task_type: str, index: int) -> int:
        """Where a task listens: the configured port of its type (one task
        of a type per node, so the port alone is unique on the node)."""
        return int(getattr(self.config.ports, task_type))

    def task_env(self) -> dict[str, str]:
        """Extra environment for the job's tasks."""
        return {}

    def can_stop(self) -> bool:
        """Whether stop/start mean anything (not for existing ssh hosts)."""
        return True

    def hourly_cost(self, nodes: Sequence[Node]) -> float | None:
        """Estimated USD per hour for these nodes as they are; None = free/unknown."""
        return None
