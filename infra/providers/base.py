"""The provider interface: where a cluster's nodes come from.

A provider answers "which of this cluster's nodes exist, in what state, at
which addresses" and changes that (create, start, stop, terminate). It does
not know about TensorFlow or SSH commands: the lifecycle module plans with
it, and a ``Transport`` (``transport()``) runs commands on the nodes. What
the nodes can do is data (``Capabilities``); cost is an optional protocol
(``Pricing``), which only a provider with a price table (gce) implements.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pydantic import BaseModel

from infra.config.loader import ClusterConfig
from infra.config.providers import PROVIDERS, ConfigHooks, provider_class, provider_factory
from infra.state.folder import ClusterState
from infra.state.keys import cluster_key

if TYPE_CHECKING:
    from infra.config.storage import NodeIdentity
    from infra.spec.job import Program
    from infra.spec.tfconfig import TaskSpec
    from infra.transport.base import Transport


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
    # The cloud identity its programs get (GCE: the service account); None: none known.
    service_account: str | None = None
    scopes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Capabilities:
    """What a provider's nodes can and cannot do: the facts the commands ask
    (``NodeProvider.capabilities``) instead of the provider's name. A why-not
    is one line, for the library error that refuses; the CLI words the rest."""

    #: Why ``stop`` (and ``start``) refuse; None: the nodes stop with their disks kept.
    cannot_stop: str | None = None
    #: Why a node may not power itself off (autostop, infra/cluster/autostop.py);
    #: None: it may, and a stopped node costs less.
    cannot_self_stop: str | None = "the nodes cannot stop themselves"
    #: Whether ``up`` installs TensorFlow and syncs the code on the nodes
    #: (not on local processes, which run this machine's files).
    needs_setup: bool = True
    #: Whether a job may bring its missing nodes up on the spot, without
    #: `up` (local processes: they cost nothing and need no setup).
    up_on_demand: bool = False
    #: Whether a node's address is the cloud's to hand to another machine
    #: once the node stops or goes (a GCE external IP): its pinned host key
    #: is then forgotten, so the next VM at that address is not refused as
    #: "changed". Fixed addresses (existing hosts, localhost) keep their pins.
    ephemeral_addresses: bool = False
    #: Whether the nodes have a cloud identity of their own (``bucket_identity``
    #: answers one): their uploader then authenticates as the node (GCE's
    #: metadata server), with no key file sent to them.
    nodes_have_identity: bool = False
    #: Whether the machines are the user's, which tfcluster reaches but never
    #: made (existing hosts): ``down`` then stops tfcluster's tasks on them
    #: and deletes nothing, a pending node is one that does not answer on its
    #: SSH port (its ``Node.status`` says why), and several clusters may share
    #: a login there, so each keeps its files in a folder of its own
    #: (``remote_root``).
    existing_hosts: bool = False
    #: How long `up` waits for the nodes to run (gce: gce.operation_timeout).
    operation_timeout: float = 600.0


class NodeProvider(ConfigHooks, ABC):
    """Creates, lists, starts, stops and terminates the nodes of one cluster,
    and says how commands reach them.

    Every method that changes state is idempotent for nodes already in the
    target state, and works on several nodes in parallel: four nodes must
    take about as long as one. What cluster.yaml asks of a provider before
    any node exists (its section, its refusals) is ``ConfigHooks``, in the
    registry (``infra/providers/__init__.py``), which the config reads. What
    the nodes can do is data (``capabilities``); what they cost is the
    optional ``Pricing`` protocol (gce's).
    """

    #: Its name in cluster.yaml's ``provider`` (the registry's key).
    kind: str = ""

    def __init__(self, config: ClusterConfig, state: ClusterState) -> None:
        self.config = config
        self.state = state
        #: This cluster's ``config_section``, as cluster.yaml gives it (the
        #: section's defaults when the file leaves it out); None: no section.
        self.section: BaseModel | None = None
        if self.config_section is not None:
            given = getattr(config, config.provider, None)
            self.section = given if given is not None else self.config_section()

    def capabilities(self) -> Capabilities:
        """What these nodes can do; by default: not stop themselves."""
        return Capabilities(
            cannot_self_stop=f"provider {self.kind} cannot stop its nodes from inside"
        )

    # -- the nodes' life ---------------------------------------------------------

    @abstractmethod
    def non_terminated_nodes(self) -> list[Node]:
        """Every existing node of this cluster (any state but terminated)."""

    def check_config(self) -> None:
        """Refuse (ConfigError) what the provider's cloud would refuse at
        create time; `up` calls it before planning, so a dry run shows it.
        Raised inside ``infra.config.loader.in_file(self.config)``, the line names
        cluster.yaml first, as the file's other problems do (gce's does)."""

    def check_owner(self) -> None:
        """Refuse (StateError) where the cloud holds nodes or shared
        resources of this cluster's name that another state made (another
        person's cluster of the same name): `up` would adopt and overwrite
        them. `up` calls it before planning, as ``check_config``."""

    def prepare(self) -> None:
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

    def wait_nodes(self, names: Sequence[str]) -> None:
        """Wait for these nodes, already on their way up, with the provider's
        own patience; by default ``lifecycle.wait_running`` alone waits."""

    @abstractmethod
    def stop_nodes(self, names: Sequence[str]) -> None:
        """Stop these nodes (disks kept) and wait until they are stopped."""

    @abstractmethod
    def terminate_nodes(self, names: Sequence[str]) -> None:
        """Delete these nodes; a node already gone is not an error."""

    def release(self) -> None:
        """Delete what ``prepare`` created; already gone is not an error."""

    # -- reaching the nodes and their tasks ----------------------------------------

    @abstractmethod
    def transport(self, nodes: Sequence[Node]) -> Transport:
        """How to run commands on these (running) nodes; an SSH transport
        logs in with ``login_key``, in ``remote_root``."""

    def task_port(self, node: str, task_type: str, index: int) -> int:
        """Where a task listens: the configured port of its type (one task
        of a type per node, so the port alone is unique on the node)."""
        return int(getattr(self.config.ports, task_type))

    def task_env(self) -> dict[str, str]:
        """Extra environment for the job's tasks."""
        return {}

    def before_tasks(self, program: Program, tasks: Sequence[TaskSpec]) -> None:
        """Called by a job's launch once its tasks are known, before the
        first one starts: what the provider does for them from this machine
        (local: their network namespace, the data the built-in trainer
        would download, a warning where other machines could reach their
        ports). Nothing by default: a VM's tasks are behind the cloud's
        firewall (gce) or the hosts' own (ssh: see README, Security)."""

    def bucket_identity(self) -> NodeIdentity | None:
        """Who the nodes write to the cluster's bucket (``storage``) as,
        where they have an identity of their own (a GCE node's service
        account, from its metadata server); None: they use
        ``storage.credentials``, this machine's, which ``up`` checks as is.
        ConfigError where the nodes could never write (scopes without
        Cloud Storage)."""
        return None


@runtime_checkable
class Pricing(Protocol):
    """What a provider that knows its cloud's prices says of cost, and of
    what `up` would create, from cluster.yaml alone (gce's, from its dated
    price table). Optional: callers ask ``isinstance(provider, Pricing)``;
    a provider without it shows no cost (local, ssh)."""

    def hourly_cost(self, nodes: Sequence[Node]) -> float | None:
        """Estimated USD per hour for these nodes as they are; None = unknown."""

    def planned_cost(self, count: int) -> float | None:
        """Estimated USD/hour of ``count`` new nodes while they run, from the
        config alone; None = unknown."""

    def price_source(self) -> str:
        """Where the estimates come from (a dated price table and its region)."""

    def planned_node(self) -> str | None:
        """What ``up`` would create for one node, from the config alone (no
        API call, no credentials): machine type, disk, zone."""

    def planned_identity(self) -> str | None:
        """Who the nodes' programs are to their cloud, from the config
        alone (gce: the service account and scopes); None: nothing of
        their own."""


def login_key(config: ClusterConfig, state: ClusterState) -> tuple[Path, str]:
    """The private key a cluster logs in to its nodes with and its public
    line: ``ssh.key_file`` when cluster.yaml sets it, else the per-cluster
    key in the state folder (made on first use). What a provider with an
    SSH transport authorizes on its nodes and hands to ``SshTransport``."""
    return cluster_key(config.ssh.key_file, state.key_file, f"tfcluster-{config.name}")


def remote_root(provider: NodeProvider) -> str:
    """The cluster's folder on its nodes (a layout path): ``setup.remote_dir``,
    where a node is the cluster's alone. On existing hosts
    (``Capabilities.existing_hosts``) other clusters may log in as the same
    user (a colleague's of the same name too), and the files, pid files and
    logs of one must never be another's: each has a folder of its own in
    it, by name and id, and sees, syncs, cancels and stops only its own."""
    base = provider.config.setup.remote_dir.rstrip("/") or "."
    if not provider.capabilities().existing_hosts:
        return base
    return f"{base}/{provider.config.name}-{provider.state.cluster_id()}"


#: What builds a provider: a ``NodeProvider`` subclass, or any callable
#: with its constructor's signature (the registry's entries).
ProviderFactory = Callable[[ClusterConfig, ClusterState], NodeProvider]


def get_provider(config: ClusterConfig, state: ClusterState | None = None) -> NodeProvider:
    """The provider cluster.yaml names."""
    factory: ProviderFactory = provider_factory(config.provider)
    return factory(config, state or ClusterState(config.name))


def used_providers(config: ClusterConfig) -> list[type[ConfigHooks]]:
    """The classes of the providers a validated config uses: the one it
    names, then any other whose section it has (config.py added those)."""
    sections = [n for n in type(config).model_fields if n not in ClusterConfig.model_fields]
    others = [n for n in sections if n in PROVIDERS and n != config.provider]
    return [provider_class(n) for n in [config.provider, *others]]
