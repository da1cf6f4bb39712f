"""What every part of ``Cluster`` stands on: the config, the state folder,
the provider, the lock, the nodes as the provider lists them.

``Cluster`` is one object to its callers (``cluster.up()``,
``cluster.launch()``, ``cluster.logs()``) but its methods live by concept in
a few modules, each a class that extends this one: the nodes' life
(infra/cluster/api.py), jobs (infra/cluster/jobs.py), looking into running
nodes by hand (infra/cluster/access.py). What they all use is here, and
``locked``, the decorator of the methods that hold the cluster's lock.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Concatenate, ParamSpec, TypeVar

from infra.config.loader import ClusterConfig
from infra.errors import ConfigError
from infra.providers.base import Node, NodeProvider, get_provider, remote_root
from infra.spec.job import JobRecord
from infra.state.folder import ClusterState
from infra.state.lock import ClusterLock
from infra.transport.base import Transport

_C = TypeVar("_C", bound="ClusterBase")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def locked(
    command: str | Callable[..., str],
) -> Callable[[Callable[Concatenate[_C, _P], _R]], Callable[Concatenate[_C, _P], _R]]:
    """Run the method under the cluster's lock, as ``command`` (a word, or
    a function of the method's arguments that gives one)."""

    def wrap(
        method: Callable[Concatenate[_C, _P], _R],
    ) -> Callable[Concatenate[_C, _P], _R]:
        @functools.wraps(method)
        def under_lock(self: _C, *args: _P.args, **kwargs: _P.kwargs) -> _R:
            with self.lock(command if isinstance(command, str) else command(*args, **kwargs)):
                return method(self, *args, **kwargs)

        return under_lock

    return wrap


class ClusterBase:
    """A cluster's config, state, provider and lock (see the module's
    docstring); ``Cluster`` is the class to use."""

    def __init__(self, config: ClusterConfig, state: ClusterState | None = None) -> None:
        self.config = config
        self.state = state or ClusterState(config.name)
        self._provider: NodeProvider | None = None
        self._lock = ClusterLock(self.state.lock_file, config.name)
        # When the command began (time.monotonic()), where it is a command
        # of its own: the start-up of a job counts from there.
        self.started: float | None = None

    def lock(self, command: str) -> AbstractContextManager[None]:
        """Hold the cluster's lock as ``command`` (infra/state/lock.py). What
        changes the cluster or its jobs holds it: up, start, stop, down,
        a job's launch, cancel, exec's sync (not its command). Reading
        never waits for it (nodes, status, logs, attach, fetch), and
        neither does following a job: ``watch`` runs for hours, and
        `cancel` or `logs` from another terminal must get through
        meanwhile; its one write (the exit code) is guarded in
        ``remember`` instead."""
        return self._lock.hold(command)

    @property
    def provider(self) -> NodeProvider:
        if self._provider is None:
            self._provider = get_provider(self.config, self.state)
        return self._provider

    # -- what exists -------------------------------------------------------------

    def nodes(self) -> list[Node]:
        nodes = self.provider.non_terminated_nodes()
        self.remember_nodes(nodes)
        return nodes

    def remember_nodes(self, nodes: Sequence[Node]) -> None:
        """Cache every node's status and addresses in the state file, as
        listed (all of them: the cache is replaced)."""
        self.state.update(
            nodes={
                n.name: {
                    "status": n.status,
                    "internal_ip": n.internal_ip,
                    "external_ip": n.external_ip,
                    "zone": n.zone,
                }
                for n in nodes
            }
        )

    def require_known(self, node: str) -> None:
        """A ConfigError (exit 2, a bad argument) unless ``node`` is one of
        cluster.yaml's nodes. Every command that takes a node name
        (``logs``, ``ssh``, ``exec --node``, ``forget-host``) refuses an
        unknown one with this one line, naming the nodes there are."""
        if node not in self.config.nodes:
            raise ConfigError(
                f"{node} is not a node of {self.config.name} ({', '.join(self.config.nodes)})"
            )

    def node_path(self, path: str | None) -> str | None:
        """A path on the nodes as cluster.yaml names it (``job.data_dir``):
        one in ``setup.remote_dir`` is in the cluster's own folder there
        (provider ssh: ``tfcluster/mnist`` is ``tfcluster/<name>-<id>/mnist``,
        where setup.sync puts it); any other is as given."""
        base = self.config.setup.remote_dir.rstrip("/") or "."
        root = remote_root(self.provider)
        if path is None or root == base or not (path + "/").startswith(base + "/"):
            return path
        return root + path[len(base) :]

    def last_job(self) -> JobRecord | None:
        data = self.state.get("last_job")
        return JobRecord.from_dict(data) if isinstance(data, dict) else None

    def keep_busy(
        self, transport: Transport, names: Sequence[str], what: str
    ) -> AbstractContextManager[None]:
        """Autostop counts these nodes busy while the ``with`` lasts
        (``autostop.busy``): install, sync, a launch, a fetch, a sweep.
        Nothing (no round trip) where the provider's nodes never stop
        themselves or autostop was never used on this cluster. It waits for
        no node (a fetch from a node that is gone must fail at once, not
        after a boot timeout): callers wait for SSH first where they must."""
        if self.provider.capabilities().cannot_self_stop is not None or not self.state.get(
            "autostop_used"
        ):
            return contextlib.nullcontext()
        from infra.cluster import autostop

        return autostop.busy(transport, names, what)
