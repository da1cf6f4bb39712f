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

An interrupted command must end at once (Ctrl-C, and SIGTERM, which
``timeout``, systemd and CI runners send, is turned into the same): the
threads are daemons, waited for in short timed waits, so the interrupt
reaches the calling thread at once and the process may exit without them;
the batch is then cancelled, and a worker's waits (``pause``) end. A pool
of ``concurrent.futures`` would hold the command until every node's wait
(a host key's, a booting node's: minutes) was over, and its threads would
hold the exit too.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from infra.errors import RemoteError

T = TypeVar("T")

MAX_WORKERS = 16

# The cancel event of the ``fan_out`` batch a worker thread runs for.
_tls = threading.local()


class Cancelled(BaseException):
    """The batch this worker runs for was interrupted: it stops (a
    BaseException, so that no ``except Exception`` of the work keeps it)."""


def _cancel_event() -> threading.Event | None:
    return cast("threading.Event | None", getattr(_tls, "cancel", None))


def pause(seconds: float) -> None:
    """Sleep; in a ``fan_out`` worker, end at once with ``Cancelled`` when
    its batch was interrupted."""
    event = _cancel_event()
    if event is None:
        time.sleep(seconds)
    elif event.wait(seconds):
        raise Cancelled


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
    outcome; results and errors keep the nodes' order. Any other exception
    is raised once every node is done (the first in the nodes' order)."""
    names = list(nodes)
    out: Fanout[T] = Fanout()
    if not names:
        return out
    # A batch started by a worker of another is cancelled with it.
    cancel = _cancel_event() or threading.Event()
    slots = threading.Semaphore(MAX_WORKERS)
    done: queue.Queue[tuple[str, bool, Any]] = queue.Queue()

    def run(node: str) -> None:
        _tls.cancel = cancel
        with slots:
            try:
                if cancel.is_set():
                    raise Cancelled
                done.put((node, True, fn(node)))
            except BaseException as exc:  # handed to the calling thread
                done.put((node, False, exc))

    outcomes: dict[str, tuple[bool, Any]] = {}
    try:
        for node in names:
            threading.Thread(target=run, args=(node,), daemon=True, name=f"node-{node}").start()
        while len(outcomes) < len(names):
            # Timed: a signal the kernel hands to a worker thread only sets
            # Python's flag, which this thread checks when it runs again.
            try:
                node, ok, value = done.get(timeout=0.2)
            except queue.Empty:
                continue
            outcomes[node] = (ok, value)
    except BaseException:
        cancel.set()
        raise
    for node in names:
        ok, value = outcomes[node]
        if ok:
            out.results[node] = value
        elif isinstance(value, RemoteError):
            out.errors[node] = value
        else:
            raise value
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
