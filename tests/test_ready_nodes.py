"""``Cluster.ready_nodes``: the one step that gets the nodes ready for any
job (`train`, `run`, `sweep`, `exec`), on the real local cluster: which
nodes, the lock held while the caller is inside and given back after, a
check that refuses before anything is synced. A job running is refused
through it word for word alike by every command: tests/test_run_local.py."""

from __future__ import annotations

import pytest

from infra.cluster.api import Cluster
from infra.config.loader import default_config
from infra.errors import ConfigError, StateError
from infra.providers.base import NodeState
from infra.state.lock import ClusterLock
from infra.transport.base import Transport


def other_holds(cluster: Cluster) -> bool:
    """Whether another command (another open of the lock file) would be
    kept out of the cluster now."""
    lock = ClusterLock(cluster.state.lock_file, cluster.config.name)
    try:
        with lock.hold("status", wait=0):
            return False
    except StateError:
        return True


def test_the_lock_is_held_inside_and_given_back_after() -> None:
    cluster = Cluster(default_config())
    assert not other_holds(cluster)
    with cluster.ready_nodes("exec", ["pc-2", "pc-3", "pc-2"]) as ready:
        assert ready.names == ["pc-2", "pc-3"]  # as named, each once
        assert other_holds(cluster)
        holder = ClusterLock(cluster.state.lock_file, cluster.config.name).holder()
        assert holder is not None and holder.command == "exec"
        assert ready.transport.run("pc-3", "echo here").stdout.strip() == "here"
        assert not ready.synced  # the local cluster runs this machine's files
    assert not other_holds(cluster)
    # A local cluster is brought up on the spot, only the nodes asked for.
    running = {n.name for n in cluster.nodes() if n.state is NodeState.RUNNING}
    assert running == {"pc-2", "pc-3"}

    # None: every running node of the config, in its order.
    with cluster.ready_nodes("exec") as ready:
        assert ready.names == ["pc-2", "pc-3"]


def test_no_node_running_and_an_unknown_node_are_refused_before_anything_starts() -> None:
    cluster = Cluster(default_config())
    idle = pytest.raises(StateError, match=r"^no node of local is running: run `deploy.py up`$")
    with idle, cluster.ready_nodes("exec"):
        pass
    unknown = pytest.raises(ConfigError, match=r"^pc-9 is not a node of local \(pc-1, pc-2, pc-3\)$")
    with unknown, cluster.ready_nodes("exec", ["pc-1", "pc-9"]):
        pass
    assert cluster.nodes() == []  # nothing was brought up
    assert not other_holds(cluster)


def test_a_failing_check_ends_it_before_the_caller_runs_and_frees_the_lock() -> None:
    cluster = Cluster(default_config())
    seen: list[list[str]] = []

    def check(transport: Transport, names: list[str]) -> None:
        seen.append(names)
        raise ConfigError("--per-node 99: too many")

    entered = False
    with (
        pytest.raises(ConfigError, match="per-node 99"),
        cluster.ready_nodes("sweep", ["pc-1"], check=check),
    ):
        entered = True
    assert seen == [["pc-1"]] and not entered
    assert not other_holds(cluster)


def test_ctrl_c_while_readying_or_inside_frees_the_lock_and_closes_the_transport() -> None:
    """Ctrl-C (KeyboardInterrupt, no TfclusterError) during the check or
    the sync, or in the caller's body: the next command is not kept out."""
    cluster = Cluster(default_config())
    closed: list[str] = []

    def check(transport: Transport, names: list[str]) -> None:
        close = transport.close

        def counted() -> None:
            closed.append("closed")
            close()

        transport.close = counted  # type: ignore[method-assign]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), cluster.ready_nodes("train", ["pc-1"], check=check):
        pass
    assert closed == ["closed"] and not other_holds(cluster)
    with pytest.raises(KeyboardInterrupt), cluster.ready_nodes("run", ["pc-1"]):
        raise KeyboardInterrupt
    assert not other_holds(cluster)
