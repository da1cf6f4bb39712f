"""One function over many nodes at once: ``fan_out``.

Every per-node operation of a cluster (run a command, connect, set up,
probe a port) runs on all nodes in parallel, and a failure on one node must
neither hide the others' results nor stop them. So each node's outcome is
kept apart: ``Fanout.results`` for the nodes that answered and
``Fanout.errors`` for those that raised ``RemoteError`` (the node could not
be reached, or refused). Anything else (a bug, KeyboardInterrupt)
propagates as it would without threads.

Threads, not processes: the work is waiting on sockets and subprocesses.
At most ``MAX_WORKERS`` at once, which bounds the SSH connections opened
together to a number sshd's MaxStartups (default 10:30:100) and a small
machine both accept.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from infra.errors import RemoteError

T = TypeVar("T")

MAX_WORKERS = 16


@dataclass
class Fanout(Generic[T]):
    """Per node: its result, or the error it raised (never both)."""

    results: dict[str, T] = field(default_factory=dict)
    errors: dict[str, RemoteError] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


def fan_out(fn: Callable[[str], T], nodes: Iterable[str]) -> Fanout[T]:
    """``fn(node)`` for every node at once. A ``RemoteError`` is that node's
    outcome; results and errors keep the nodes' order."""
    names = list(nodes)
    out: Fanout[T] = Fanout()
    if not names:
        return out
    with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(names))) as pool:
        futures = {node: pool.submit(fn, node) for node in names}
        for node, future in futures.items():
            try:
                out.results[node] = future.result()
            except RemoteError as exc:
                out.errors[node] = exc
    return out


def in_threads(
    target: Callable[[str], None],
    nodes: Sequence[str],
    fatal: Callable[[], BaseException | None] = lambda: None,
) -> None:
    """``target(node)`` for every node at once, each in a thread. The
    waiting is in short joins so that Ctrl-C reaches this thread at once
    (a plain join would hold it until every node is done), and ``fatal``
    is checked between them: what it returns is raised without waiting
    for the other nodes. For work that runs until Ctrl-C (following
    logs, a streamed command), where ``fan_out``'s pool would not let go."""
    threads = [threading.Thread(target=target, args=(n,), daemon=True) for n in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)
            if (exc := fatal()) is not None:
                raise exc
