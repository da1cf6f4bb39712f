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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from infra.config import ClusterConfig
from infra.keys import cluster_key
from infra.providers import PROVIDERS, ConfigHooks, provider_class, provider_factory
from infra.state import ClusterState

if TYPE_CHECKING:
    from infra.job_spec import Program
    from infra.storage.config import NodeIdentity
    from infra.tfconfig import TaskSpec
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
    # The cloud identity its programs get (GCE: the service account); None: none known.
    service_account: str | None = None
    scopes: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostKeys:
    """The SSH host keys a node should present, as its provider learnt them
    over a channel other than SSH itself (GCE: what the guest agent
    publishes in guest attributes, read over the authenticated Compute API).
    """

    # The name they are pinned under in known_hosts: the machine's own
    # identity, not its address, so the pin survives stop/start and a new
    # ephemeral IP (GCE: ``compute.<instance id>``, as gcloud names it).
    alias: str
    # ``"<type> <base64>"`` lines; empty while the node has not published
    # them yet (a GCE guest agent does so some seconds after boot).
    keys: tuple[str, ...] = ()


class NodeProvider(ConfigHooks, ABC):
    """Creates, lists, starts, stops and terminates the nodes of one cluster.

    Every method that changes state is idempotent for nodes already in the
    target state, and works on several nodes in parallel: four nodes must
    take about as long as one. What cluster.yaml asks of a provider before
    any node exists (its section, its refusals) is ``ConfigHooks``, in the
    registry (``infra/providers/__init__.py``), which the config reads.
    """

    #: Its name in cluster.yaml's ``provider`` (the registry's key).
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

    def check_config(self) -> None:
        """Refuse (ConfigError) what the provider's cloud would refuse at
        create time; `up` calls it before planning, so a dry run shows it.
        Raised inside ``infra.config.in_file(self.config)``, the line names
        cluster.yaml first, as the file's other problems do (gce's does)."""

    def login_key(self) -> tuple[Path, str]:
        """The private key this cluster logs in to its nodes with and its
        public line: ``ssh.key_file`` when cluster.yaml sets it, else the
        per-cluster key in the state folder (made on first use). What a
        provider with an SSH transport authorizes on its nodes and hands to
        ``SshTransport``."""
        return cluster_key(
            self.config.ssh.key_file, self.state.key_file, f"tfcluster-{self.config.name}"
        )

    def remote_root(self) -> str:
        """The cluster's folder on its nodes (a layout path): ``setup.remote_dir``,
        where a node is the cluster's alone; provider ssh: a folder of the
        cluster's own in it."""
        return self.config.setup.remote_dir.rstrip("/") or "."

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

    # -- reaching the nodes --------------------------------------------------------

    @abstractmethod
    def transport(self, nodes: Sequence[Node]) -> Transport:
        """How to run commands on these (running) nodes."""

    def host_keys(self, node: Node) -> HostKeys | None:
        """The host keys ``node`` must present, known without asking the
        node; None: the provider has no such channel, and the transport
        trusts the key it sees on first contact and pins it (provider ssh)."""
        return None

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

    #: Whether the nodes have a cloud identity of their own (``bucket_identity``
    #: answers one): their uploader then authenticates as the node (GCE's
    #: metadata server), with no key file sent to them.
    nodes_have_identity = False

    def bucket_identity(self) -> NodeIdentity | None:
        """Who the nodes write to the cluster's bucket (``storage``) as,
        where they have an identity of their own (a GCE node's service
        account, from its metadata server); None: they use
        ``storage.credentials``, this machine's, which ``up`` checks as is.
        ConfigError where the nodes could never write (scopes without
        Cloud Storage)."""
        return None

    def can_stop(self) -> bool:
        """Whether stop/start mean anything (not for existing ssh hosts)."""
        return True

    def cannot_stop(self) -> str:
        """Why ``stop`` refuses where ``can_stop`` is False, in one line."""
        return f"provider {self.kind} cannot stop its nodes (they are not ours to stop)"

    def self_stop(self) -> str | None:
        """Whether a node may power itself off (autostop, infra/autostop.py):
        None when it can, and stopping saves money; otherwise why not, as
        one line for the user."""
        return f"provider {self.kind} cannot stop its nodes from inside"

    #: Whether a node's address is the cloud's to hand to another machine
    #: once the node stops or goes (a GCE external IP): its pinned host key
    #: is then forgotten, so the next VM at that address is not refused as
    #: "changed". Fixed addresses (existing hosts, localhost) keep their pins.
    ephemeral_addresses = False

    #: Whether a job may bring its missing nodes up on the spot, without
    #: `up` (local processes: they cost nothing and need no setup).
    up_on_demand = False

    def operation_timeout(self) -> float:
        """How long `up` waits for the nodes to run: the provider's own
        patience (gce: gce.operation_timeout)."""
        return 600.0

    def section(self) -> BaseModel | None:
        """This cluster's ``config_section``, as cluster.yaml gives it (the
        section's defaults when the file leaves it out)."""
        if self.config_section is None:
            return None
        given = getattr(self.config, self.config.provider, None)
        return given if given is not None else self.config_section()

    def pending_reason(self, node: Node) -> str | None:
        """Why a pending node is not up yet, for `up`'s plan; None: it is
        merely on its way (a booting VM)."""
        return None

    def not_running(self, node: Node) -> str:
        """One clause on a node a command needs that is not running."""
        return f"{node.name} is {node.state.value}"

    #: What to do about nodes that are not running, after ``not_running``.
    not_running_hint = "run `deploy.py up` first"

    def hourly_cost(self, nodes: Sequence[Node]) -> float | None:
        """Estimated USD per hour for these nodes as they are; None = free/unknown."""
        return None

    # -- what the commands say -------------------------------------------------------
    # Words differ per provider ("delete" is a lie for machines tfcluster
    # never made): each provider says them, so that no command asks which
    # provider it has.

    #: Whether ``up`` installs TensorFlow and syncs the code on the nodes
    #: (not on local processes, which run this machine's files).
    needs_setup = True

    #: What ``down`` does to one node, as a plan line's verb ("delete  pc-1").
    down_verb = "delete"
    #: ``down``'s question before it acts.
    down_question = "delete these, with their disks?"
    #: What ``down`` did; ``{name}`` is the cluster's name.
    down_done = "deleted {name}: nothing left running or billed"

    def planned_node(self) -> str | None:
        """What ``up`` would create for one node, from the config alone (no
        API call, no credentials): machine type, disk, zone. None: nothing
        worth saying (local folders, existing hosts)."""
        return None

    def planned_identity(self) -> str | None:
        """Who the nodes' programs are to their cloud, from the config
        alone (gce: the service account and scopes); None: nothing of
        their own."""
        return None

    def planned_cost(self, count: int) -> float | None:
        """Estimated USD/hour of ``count`` new nodes while they run, from the
        config alone; None = free/unknown."""
        return None

    def price_source(self) -> str | None:
        """Where the cost estimates come from (a dated price table and its
        region); None when the provider has no cost."""
        return None


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
