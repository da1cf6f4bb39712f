"""Autostop: a node that has run no job task for a while stops itself.

The point of ``stop`` is money, and people forget it. With ``autostop: 30m``
(cluster.yaml, ``up --autostop``, or ``deploy.py autostop`` on a running
cluster) every node runs a small watcher (the bash loop of
``autostop_commands.autostop_script``) that powers the guest off once no task of any
job (train, run, exec) has run on it for that long. On GCE a guest shutdown
leaves the instance TERMINATED: disks kept, no compute billed, and the node
needs no cloud credentials to do it. Whether a provider's nodes can stop
themselves is the provider's to say (``Capabilities.cannot_self_stop``): existing
machines (ssh) are not ours to power off, local processes cost nothing.

Idle is decided on the node with the very liveness test the orchestrator
uses (``commands.alive_pid``: pid file + start tick + TFCLUSTER_TASK), so
the two never disagree: a job whose tasks still run is never stopped under
it. A node without a task of the running job (the ps node of a sync job,
the workers of a single-node one) is not needed by that job and may stop;
``up``/``start`` bring it back. A job's other tasks end with its chief even
with nobody attached (infra/node/watchdog.py), so a forgotten ``--detach`` job
leaves its nodes idle, not busy for ever. What the operator's commands do
on a node over SSH (install, sync, a launch, the end-of-job fetch, a
sweep) keeps it busy through a mark it holds meanwhile (``busy``), and
TensorBoard counts as a task. The idle time counts from the end of the
last of these.

This module holds what is decidable here (the cluster-wide
summary of what the nodes report, the busy marks' holding); the shell text
is in ``infra/node/autostop_commands.py``, its parser in ``infra/node/facts.py``, the
durations in ``infra/config/durations.py``.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from infra.config.durations import (
    CHECK_EVERY_S,
    format_duration,
)
from infra.errors import RemoteError
from infra.node import autostop_commands, facts
from infra.transport.base import Transport
from infra.transport.fanout import fan_out

log = logging.getLogger("tfcluster")

# A busy mark is written again this often while its command works; it
# counts for BUSY_LEASE_S after the last time (a command that died).
BUSY_RENEW_S = 15

@dataclass(frozen=True)
class ClusterIdle:
    """What ``status`` says of autostop: the setting the nodes hold and how
    long the cluster has been idle (its least idle node)."""

    after_s: int | None  # None: off
    idle_s: int | None  # None: no running node answered
    busy: bool  # a task runs on some node now
    installed: bool  # a watcher runs on every answering node

    def text(self) -> str:
        if self.after_s is None:
            return "autostop: off"
        line = f"autostop: {format_duration(self.after_s)}"
        if self.busy:
            return line + "; busy: a job, TensorBoard or a sync runs (not idle)"
        if self.idle_s is None:
            if not self.installed:
                return line + "; no node running (`deploy.py start` brings them back)"
            return line + "; idle time unknown (no running node answered)"
        left = max(0, self.after_s - self.idle_s)
        line += f"; idle {format_duration(self.idle_s)}, stops in about {format_duration(left)}"
        if not self.installed:
            line += " (watcher not running on every node: `deploy.py start` restarts it)"
        return line


def summarize(reports: Mapping[str, facts.AutostopFacts]) -> ClusterIdle | None:
    """The cluster's autostop from each answering node's report; None when
    no node has ever had a setting (autostop never used)."""
    if not reports or all(r.after_s is None and not r.configured for r in reports.values()):
        return None
    settings = {r.after_s for r in reports.values()}
    # The nodes hold one setting; should they disagree (a node that was
    # stopped during `deploy.py autostop`), the soonest is what happens.
    known = [s for s in settings if s is not None]
    after = min(known) if known else None
    return ClusterIdle(
        after_s=after,
        idle_s=min(r.idle_s for r in reports.values()),
        busy=any(r.busy for r in reports.values()),
        installed=all(r.watching for r in reports.values()),
    )


# -- on the nodes ------------------------------------------------------------------------


def apply(
    transport: Transport, names: Sequence[str], after_s: int | None, *, keep: bool = False
) -> dict[str, facts.AutostopFacts]:
    """Set autostop on these nodes (``keep``: leave the setting they hold)
    and make sure each runs its watcher; what each then reports."""
    scripts = {
        n: autostop_commands.autostop_apply(
            transport.layout(n), after_s, keep=keep, check_every=CHECK_EVERY_S
        )
        for n in names
    }
    results = transport.run_all(scripts, timeout=60)
    out: dict[str, facts.AutostopFacts] = {}
    problems = []
    for node, result in results.items():
        found = facts.parse_autostop(result.stdout)
        if not result.ok or found is None:
            problems.append(f"{node}: {result.tail() or 'no answer from the watcher'}")
        else:
            out[node] = found
    if problems:
        raise RemoteError("could not set autostop: " + "; ".join(sorted(problems)))
    return out


def report(transport: Transport, names: Sequence[str]) -> dict[str, facts.AutostopFacts]:
    """What each node's watcher holds and sees; a node that does not answer
    is left out (status must not fail for it)."""

    def one(node: str) -> facts.AutostopFacts | None:
        try:
            result = transport.run(
                node, autostop_commands.autostop_status(transport.layout(node)), timeout=20
            )
        except RemoteError:
            return None
        return facts.parse_autostop(result.stdout)

    found = fan_out(one, names).results
    return {n: f for n in names if (f := found.get(n)) is not None}


@contextlib.contextmanager
def busy(transport: Transport, names: Sequence[str], what: str) -> Iterator[None]:
    """Hold these nodes busy while the ``with`` lasts, for work that runs
    over SSH rather than as a task (install, sync, a launch, a fetch, a
    sweep): a busy mark on each node, renewed every ``BUSY_RENEW_S`` on a
    thread, removed at the end, each time starting the node's idle clock
    again. Marking is best effort: a node that cannot be told is warned
    about, never a reason to fail the work (which meets the same node
    anyway). Where autostop was never set on a node, its commands do
    nothing."""
    name = f"{what}-{secrets.token_hex(4)}"
    nodes = list(names)

    def tell(script: Callable[[str], str], doing: str, level: int = logging.WARNING) -> None:
        try:
            transport.run_all({n: script(n) for n in nodes}, timeout=30)
        except RemoteError as exc:
            log.log(level, "could not %s for autostop: %s", doing, exc)

    def mark(node: str) -> str:
        return autostop_commands.busy_mark(transport.layout(node), name)

    tell(mark, "mark the nodes busy")
    done = threading.Event()

    def renew() -> None:
        while not done.wait(BUSY_RENEW_S):
            tell(mark, "renew the busy marks", logging.DEBUG)  # warned once above

    thread = threading.Thread(target=renew, daemon=True, name=f"busy-{what}")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        tell(lambda n: autostop_commands.busy_clear(transport.layout(n), name), "clear a mark")
