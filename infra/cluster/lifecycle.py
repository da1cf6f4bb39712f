"""Plans and carries out up / stop / start / down with any provider.

A plan is computed from what the provider reports now (labels on GCE are
the truth), so it is always safe to run again: a second ``up`` finds every
node running and does nothing; ``up`` after a Ctrl-C finds what the first
one created. ``--dry-run`` prints the plan and stops before ``apply_*``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from infra.errors import ProviderError, StateError
from infra.providers.base import Node, NodeProvider, NodeState

log = logging.getLogger("tfcluster")


@dataclass(frozen=True)
class UpPlan:
    create: list[str]  # declared nodes that do not exist
    start: list[str]  # exist but stopped (or stopping)
    wait: list[str]  # on their way up already (pending)
    reuse: list[str]  # running: nothing to do
    shared: list[str] = field(default_factory=list)  # firewall rules, keys: ensured
    # Why a node in ``wait`` is not up (provider ssh: the host's probe, such
    # as REFUSED); absent: a cloud node already starting.
    why: dict[str, str] = field(default_factory=dict)
    # Set when the existing nodes could not be listed (``up --dry-run``
    # without credentials): why, and the plan assumes that none exists.
    unlisted: str | None = None
    # The listing the plan was made from (every non-terminated node, those
    # cluster.yaml no longer declares too): passed down, not listed again.
    nodes: list[Node] = field(default_factory=list, compare=False, repr=False)

    @property
    def changes(self) -> bool:
        return bool(self.create or self.start or self.wait)

    def lines(self, new_node: str | None = None) -> list[str]:
        """One line per node and shared resource; ``new_node``: what a
        created node is (``Pricing.planned_node``)."""
        what = f" ({new_node})" if new_node else ""
        out = [f"create  {name}{what}" for name in self.create]
        out += [f"start   {name}" for name in self.start]
        out += [
            f"wait    {name} (not answering on its SSH port: {self.why[name].lower()})"
            if name in self.why
            else f"wait    {name} (already starting)"
            for name in self.wait
        ]
        out += [f"keep    {name} (running)" for name in self.reuse]
        out += [f"ensure  {what}" for what in self.shared]
        return out


@dataclass(frozen=True)
class DownPlan:
    delete: list[str]  # every node of the cluster, declared or not
    shared: list[str] = field(default_factory=list)

    def lines(self, verb: str = "delete") -> list[str]:
        """``verb``: what ``down`` does to a node, as the CLI words it
        (delete, or release for existing hosts); shared resources are
        always deleted."""
        out = [f"{verb:<7} {name}" for name in self.delete]
        out += [f"delete  {what}" for what in self.shared]
        return out


def plan_up(provider: NodeProvider, existing: Sequence[Node]) -> UpPlan:
    config = provider.config
    by_name = {node.name: node for node in existing}
    create, start, wait, reuse = [], [], [], []
    why = {}
    for name in config.nodes:
        node = by_name.get(name)
        if node is None:
            create.append(name)
        elif node.state in (NodeState.STOPPED, NodeState.STOPPING):
            start.append(name)
        elif node.state is NodeState.PENDING:
            wait.append(name)
            if provider.capabilities().existing_hosts:
                why[name] = node.status  # the host's probe: REFUSED, TIMEOUT, ...
        else:
            reuse.append(name)
    return UpPlan(
        create, start, wait, reuse, provider.shared_resources(), why, nodes=list(existing)
    )


def plan_down(existing: Sequence[Node], shared: Sequence[str]) -> DownPlan:
    # Every node with the cluster's label goes, also ones no longer declared:
    # `down` promises that nothing is left to pay for.
    return DownPlan(sorted(node.name for node in existing), list(shared))


def apply_up(provider: NodeProvider, plan: UpPlan, *, timeout: float = 900.0) -> list[Node]:
    """Carry out ``plan``; return the declared nodes, all running."""
    provider.prepare()
    if plan.create:
        log.info("creating %s", ", ".join(plan.create))
        provider.create_nodes(plan.create)
    if plan.start:
        log.info("starting %s", ", ".join(plan.start))
        provider.start_nodes(plan.start)
    if plan.wait:
        # Nodes already on their way up; the provider knows how long they may
        # take (provider ssh: ssh.boot_timeout, not the cloud's ``timeout``).
        provider.wait_nodes(plan.wait)
    if not plan.changes and (ready := _running(plan.nodes, provider.config.nodes)) is not None:
        return ready  # running as planned: the plan's listing, not another
    return wait_running(provider, provider.config.nodes, timeout=timeout)


def _running(nodes: Sequence[Node], names: Sequence[str]) -> list[Node] | None:
    """The named nodes, when every one is running with its address; else None."""
    by_name = {n.name: n for n in nodes}
    found = [by_name.get(name) for name in names]
    ready = [n for n in found if n is not None and n.state is NodeState.RUNNING and n.internal_ip]
    return ready if len(ready) == len(names) else None


def wait_running(provider: NodeProvider, names: Sequence[str], *, timeout: float) -> list[Node]:
    """Poll until every named node is running with its addresses known."""
    deadline = time.monotonic() + timeout
    delay = 0.2
    while True:
        nodes = {n.name: n for n in provider.non_terminated_nodes()}
        missing = [name for name in names if name not in nodes]
        if missing:
            raise ProviderError(
                f"{', '.join(missing)} disappeared while starting the cluster "
                "(deleted or preempted); run `deploy.py up` again"
            )
        not_ready = [
            name
            for name in names
            if nodes[name].state is not NodeState.RUNNING or not nodes[name].internal_ip
        ]
        if not not_ready:
            return [nodes[name] for name in names]
        if time.monotonic() > deadline:
            states = ", ".join(f"{n}={nodes[n].status}" for n in not_ready)
            raise ProviderError(
                f"nodes not running after {timeout:.0f} s: {states}; "
                "check `deploy.py status` and run `deploy.py up` again"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 5.0)


def apply_stop(provider: NodeProvider, existing: Sequence[Node]) -> list[str]:
    """Stop the running nodes; returns their names (empty: nothing to do)."""
    if (why := provider.capabilities().cannot_stop) is not None:
        raise StateError(why)
    names = [n.name for n in existing if n.state in (NodeState.RUNNING, NodeState.PENDING)]
    if names:
        provider.stop_nodes(names)
    return names


def apply_start(
    provider: NodeProvider,
    existing: Sequence[Node],
    names: Sequence[str] | None = None,
    *,
    start: Callable[[list[str]], None] | None = None,
) -> list[Node]:
    """Start the stopped nodes (of ``names``, default every one); return
    the named nodes (default every declared one), running, with their
    (new) addresses. ``start``: how the stopped ones are started (default
    the provider's ``start_nodes``; a recovery retries a zone out of
    capacity)."""
    if provider.capabilities().cannot_stop is not None:
        raise StateError(f"provider {provider.kind} has no stopped nodes to start")
    wanted = list(provider.config.nodes if names is None else names)
    by_name = {n.name: n for n in existing}
    missing = [name for name in wanted if name not in by_name]
    if missing:
        raise StateError(
            f"{', '.join(missing)} does not exist; `deploy.py up` creates it, "
            "`start` only starts stopped nodes"
        )
    stopped = [
        n.name
        for n in existing
        if n.state in (NodeState.STOPPED, NodeState.STOPPING) and (names is None or n.name in names)
    ]
    if stopped:
        (start or provider.start_nodes)(stopped)
    return wait_running(provider, wanted, timeout=900.0)


def apply_down(provider: NodeProvider, plan: DownPlan) -> None:
    if plan.delete:
        provider.terminate_nodes(plan.delete)
    provider.release()


def require_running(provider: NodeProvider, existing: Sequence[Node], names: Sequence[str]) -> None:
    """A one-line StateError unless every named node is running."""
    by_name = {n.name: n for n in existing}
    hosts = provider.capabilities().existing_hosts
    problems = []
    for name in names:
        node = by_name.get(name)
        if node is None:
            problems.append(f"{name} does not exist")
        elif node.state is not NodeState.RUNNING:
            problems.append(_not_running(node, hosts))
    if problems:
        # An existing host that does not answer is the user's to start (or
        # to fix the address of); a node of ours, `up`'s.
        hint = (
            "start that machine (or fix hosts.<node> in cluster.yaml), then run `deploy.py up`"
            if hosts
            else "run `deploy.py up` first"
        )
        raise StateError(f"{'; '.join(problems)}: {hint}")


def _not_running(node: Node, existing_host: bool) -> str:
    """One clause on a node a command needs that is not running."""
    if existing_host and node.state is NodeState.PENDING:
        return f"{node.name} does not answer on its SSH port ({node.status.lower()})"
    return f"{node.name} is {node.state.value}"
