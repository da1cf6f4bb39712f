"""How commands reach the nodes: the seam between "what to run" and "where".

The job and setup modules build shell commands (``infra/commands.py``) and
parse what they print (``infra/facts.py``); a ``Transport`` only carries
them. ``LocalTransport`` (provider local) runs them with bash on this
machine, each node in its own home folder; ``SshTransport`` (providers ssh
and gce, ``infra/remote.py``) runs them over SSH with Fabric. Both run the
*same* commands, so the local cluster exercises the real job logic.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from infra.errors import RemoteError


@dataclass(frozen=True)
class CommandResult:
    node: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self, lines: int = 3) -> str:
        """The last lines of stderr (else stdout), for one-line error messages."""
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return " | ".join(text[-lines:]) if text else f"exit code {self.exit_code}"


@dataclass(frozen=True)
class NodeLayout:
    """Where things live on a node. Relative paths are from the login's home
    (the folder every command starts in); absolute ones are used as they are."""

    root: str  # setup.remote_dir: everything tfcluster puts on the node
    code: str  # the synced project (trainer/ ...); PYTHONPATH for the tasks
    python: str  # the interpreter that runs `python -m trainer`
    runs: str  # run folders written by the chief
    logs: str  # one log, pid and exit file per task of the current job


class Transport(ABC):
    """Runs shell commands on a cluster's nodes."""

    def __init__(self, nodes: Sequence[str]) -> None:
        self.nodes = list(nodes)

    @abstractmethod
    def layout(self, node: str) -> NodeLayout:
        """Paths on ``node``."""

    @abstractmethod
    def run(self, node: str, command: str, *, timeout: float | None = None) -> CommandResult:
        """Run ``command`` (bash) on ``node``. A non-zero exit is a result, not
        an error; failing to reach the node raises ``RemoteError``."""

    @abstractmethod
    def stream(
        self,
        node: str,
        command: str,
        on_line: Callable[[str], None],
        *,
        timeout: float | None = None,
    ) -> int:
        """Run ``command`` and call ``on_line`` with each stdout line as it
        arrives; returns the exit code."""

    @abstractmethod
    def fetch(self, node: str, remote_path: str, local_dir: Path) -> None:
        """Copy the folder ``remote_path`` of ``node`` into ``local_dir``
        (created; existing files are overwritten)."""

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release connections."""

    def run_all(
        self, commands: Mapping[str, str], *, timeout: float | None = None
    ) -> dict[str, CommandResult]:
        """Run one command per node, all at once. Nodes that cannot be
        reached are reported together in one ``RemoteError``."""
        if not commands:
            return {}
        results: dict[str, CommandResult] = {}
        failures: dict[str, str] = {}
        with ThreadPoolExecutor(max_workers=min(16, len(commands))) as pool:
            futures = {
                node: pool.submit(self.run, node, command, timeout=timeout)
                for node, command in commands.items()
            }
            for node, future in futures.items():
                try:
                    results[node] = future.result()
                except RemoteError as exc:
                    failures[node] = str(exc)
        if failures:
            raise RemoteError("; ".join(f"{node}: {why}" for node, why in sorted(failures.items())))
        return results

    def check_all(
        self, commands: Mapping[str, str], *, what: str, timeout: float | None = None
    ) -> dict[str, CommandResult]:
        """``run_all`` where a non-zero exit on any node is an error naming it."""
        results = self.run_all(commands, timeout=timeout)
        failed = {node: r for node, r in results.items() if not r.ok}
        if failed:
            raise RemoteError(
                f"{what} failed on "
                + "; ".join(f"{node}: {r.tail()}" for node, r in sorted(failed.items()))
            )
        return results

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
