"""infra.fanout: one function over many nodes, each node's outcome apart."""

from __future__ import annotations

import threading

import pytest

from infra.errors import RemoteError
from infra.fanout import fan_out


def test_results_and_errors_per_node_in_the_nodes_order() -> None:
    def fn(node: str) -> int:
        if node == "pc-2":
            raise RemoteError(f"{node}: unreachable")
        return len(node)

    done = fan_out(fn, ["pc-3", "pc-2", "pc-10"])
    assert list(done.results) == ["pc-3", "pc-10"]
    assert done.results == {"pc-3": 4, "pc-10": 5}
    assert list(done.errors) == ["pc-2"] and str(done.errors["pc-2"]) == "pc-2: unreachable"
    assert not done.ok


def test_runs_at_once_and_nothing_for_no_nodes() -> None:
    barrier = threading.Barrier(3, timeout=10)
    done = fan_out(lambda node: barrier.wait() >= 0, ["a", "b", "c"])
    assert done.ok and all(done.results.values())
    empty = fan_out(lambda node: 1, [])
    assert empty.ok and empty.results == {}


def test_other_errors_are_bugs_and_propagate() -> None:
    def fn(node: str) -> None:
        raise ValueError(node)

    with pytest.raises(ValueError):
        fan_out(fn, ["a"])
