"""infra.transport.fanout: one function over many nodes, each node's outcome apart."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from infra.errors import RemoteError
from infra.transport.fanout import fan_out


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


def test_an_interrupt_returns_at_once_and_ends_the_workers_waits() -> None:
    # Issue 26: a worker waiting minutes (a node's host keys, its SSH) must
    # neither hold the interrupted caller nor go on waiting after it. The
    # signal lands on a worker thread, as the kernel may deliver it.
    from infra.transport.fanout import Cancelled, pause

    waiting = threading.Barrier(3, timeout=10)
    cancelled: list[str] = []

    def fn(node: str) -> None:
        waiting.wait()
        if node == "a":
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        try:
            pause(300)
        except Cancelled:
            cancelled.append(node)
            raise

    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        fan_out(fn, ["a", "b", "c"])
    assert time.monotonic() - began < 30  # not the pauses' 300 s
    deadline = time.monotonic() + 10
    while len(cancelled) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(cancelled) == ["a", "b", "c"]
