"""How commands reach the nodes: the seam between "what to run" and "where".

The job and setup modules build shell commands (``infra/node/commands.py``) and
parse what they print (``infra/node/facts.py``); a ``Transport`` only carries
them. ``LocalTransport`` (provider local) runs them with bash on this
machine, each node in its own home folder; ``SshTransport`` (providers ssh
and gce, ``infra/transport/ssh.py``) runs them over SSH with Fabric. Both run the
*same* commands, so the local cluster exercises the real job logic.
"""

from __future__ import annotations

import posixpath
import shutil
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from infra.errors import ConfigError, RemoteError
from infra.transport.fanout import fan_out


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
    # The folder of the login that several clusters share (provider ssh:
    # setup.remote_dir, each cluster's ``root`` in it, and the node
    # environment, ``python``'s venv); None where the node is one cluster's.
    shared: str | None = None

    @property
    def bin(self) -> str:
        """The node environment's bin folder: first on every task's PATH,
        so ``python`` (and ``pip``) there are the ones with TensorFlow."""
        return posixpath.dirname(self.python) or "."

    @property
    def venv(self) -> str:
        """The node environment: the venv ``python`` is in."""
        return posixpath.dirname(self.bin) or "."

    @property
    def env(self) -> str:
        """Where the node environment's files are (the venv, the wheelhouse,
        the pinned requirements): ``root``, or the login's folder where
        several clusters share one install."""
        return posixpath.dirname(self.venv) or "."


def free_local_port(wanted: int = 0) -> int:
    """``wanted`` when it is free on 127.0.0.1 (and not 0), else a free port
    the system picks. Free now: another program may take it before it is
    bound again (the caller binds it at once)."""
    for port in (wanted, 0) if wanted else (0,):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise RemoteError("no free local port")


def wanted_local_port(port: int, *, exact: bool) -> int:
    """The port here a tunnel (or a local server) is to use: ``port`` when
    it is free; a taken one is refused when it was asked for by name
    (``exact``: `--port 6123`) and replaced by any free one otherwise (the
    default 6006, taken by another TensorBoard); 0 is any free port."""
    if exact and port and free_local_port(port) != port:
        raise ConfigError(
            f"--port {port}: that port is taken on this machine; "
            "choose another, or --port 0 for any free one"
        )
    return free_local_port(port)


class Transport(ABC):
    """Runs shell commands on a cluster's nodes."""

    #: Whether the nodes have files of their own, so the code and the
    #: working folder must be synced to them (not for local processes,
    #: which run this machine's files where they are).
    copies_files = True
    #: Whether a node's 127.0.0.1 is this machine's (local processes): a
    #: server on a node then listens on the port wanted here itself.
    ports_are_here = False

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

    def workdir(self, node: str, local: Path) -> str:
        """Where the working folder ``local`` is on ``node`` (a layout path):
        its synced copy, or ``local`` itself where the files are shared."""
        if not self.copies_files:
            return str(local)
        return f"{self.layout(node).root}/work"

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release connections."""

    def forward(
        self, node: str, remote_port: int, local_port: int = 0
    ) -> AbstractContextManager[int]:
        """Make ``remote_port`` of the node's 127.0.0.1 reachable on this
        machine's 127.0.0.1 while the ``with`` lasts; the context's value is
        the port here (``local_port`` when free, else any free one)."""
        raise RemoteError(f"{node}: {type(self).__name__} cannot forward ports")

    def run_in_task_network(
        self, node: str, command: str, *, timeout: float | None = None
    ) -> CommandResult:
        """``run``, where a job's tasks have their network: for the commands
        that start them and those that wait for their ports. The same as
        ``run`` on a node that is a machine of its own; the local cluster's
        tasks have a network namespace of their own
        (infra/providers/local_network.py), which nothing outside reaches."""
        return self.run(node, command, timeout=timeout)

    def run_all(
        self,
        commands: Mapping[str, str],
        *,
        timeout: float | None = None,
        in_task_network: bool = False,
    ) -> dict[str, CommandResult]:
        """Run one command per node, all at once (``in_task_network``: with
        ``run_in_task_network``). Nodes that cannot be reached are reported
        together in one ``RemoteError``."""
        run = self.run_in_task_network if in_task_network else self.run
        done = fan_out(lambda node: run(node, commands[node], timeout=timeout), commands)
        if done.errors:
            raise RemoteError(
                "; ".join(f"{node}: {exc}" for node, exc in sorted(done.errors.items()))
            )
        return done.results

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

    # -- what only nodes with files of their own need -------------------------------
    # (``copies_files``: the SSH transport). Local processes share this
    # machine's files and shell, so the defaults do nothing or refuse.

    def wait_ready(  # noqa: B027 - nothing to wait for by default
        self, timeout: float | None = None, nodes: Sequence[str] | None = None
    ) -> None:
        """Until every node (or those of ``nodes``) accepts commands, at most
        ``timeout`` seconds; local processes are ready at once."""

    def interactive(self, node: str) -> int | None:
        """An interactive shell on ``node``; its exit code. None where the
        node has no login of its own (a local node is a folder here)."""
        return None

    def local_folder(self, node: str) -> Path | None:
        """The folder on this machine that is ``node`` (local processes);
        None where the node is a machine of its own."""
        return None

    def upload(self, node: str, local: Path | bytes, remote_path: str) -> None:
        """Write a local file (or bytes) to ``remote_path`` on ``node``."""
        raise RemoteError(f"{node}: {type(self).__name__} nodes share this machine's files")

    def write_private(self, node: str, remote_path: str, data: bytes) -> None:
        """Write ``data`` to ``remote_path`` (a layout path) on ``node`` so
        that only the login can read it: 0600 in a 0700 folder, under a
        temporary name renamed into place. Here: a node that is a folder of
        this machine (``local_folder``); SSH nodes write it with SFTP."""
        folder = self.local_folder(node)
        if folder is None:
            raise RemoteError(f"{node}: {type(self).__name__} cannot write files")
        from infra.state.keys import write_private_file

        target = Path(remote_path)
        try:
            write_private_file(target if target.is_absolute() else folder / target, data)
        except OSError as exc:
            raise RemoteError(
                f"{node}: cannot write {remote_path}: {exc.strerror or exc}"
            ) from None

    @staticmethod
    def has_local_rsync() -> bool:
        """rsync on this machine."""
        return shutil.which("rsync") is not None

    def has_rsync(self, node: str) -> bool:
        """rsync on both ends, to move files with."""
        return False

    def note_rsync(self, node: str, present: bool) -> None:  # noqa: B027 - nothing to cache
        """Whether ``node`` has rsync, as a probe found (saves asking again)."""

    def rsync_remote(self, node: str, path: str) -> str:
        """``path`` on ``node`` as rsync spells a remote file."""
        raise RemoteError(f"{node}: {type(self).__name__} nodes have no rsync remote")

    def rsync(self, node: str, args: Sequence[str], *, timeout: float | None = None) -> str:
        """Run local rsync with ``args`` over this node's connection; its stdout."""
        raise RemoteError(f"{node}: {type(self).__name__} nodes have no rsync remote")

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
