"""Provider ``local``: the roles as processes on this machine.

The embedded default, so a new user runs the whole product with no cloud.
Each node is a folder under the cluster's state folder that plays the
login's home; the tasks run this checkout's ``trainer`` with this Python,
listen on free ports of a network namespace of the cluster's own (which no
other machine reaches: infra/providers/local_network.py), and
are started, watched and stopped by the very shell commands a VM gets
(through ``LocalTransport``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from infra.config.base import Strict
from infra.errors import JobFailed, RemoteError
from infra.node import commands
from infra.providers import local_network
from infra.providers.base import Capabilities, Node, NodeProvider, NodeState
from infra.providers.local_network import Holder, TaskNetwork
from infra.transport.base import CommandResult, NodeLayout, Transport

if TYPE_CHECKING:
    from infra.spec.job import Program
    from infra.spec.tfconfig import TaskSpec

log = logging.getLogger("tfcluster")

# The checkout that holds trainer/: what the local tasks import.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class LocalTransport(Transport):
    """Runs commands with bash on this machine, in each node's folder."""

    copies_files = False
    ports_are_here = True

    def __init__(
        self, nodes: Sequence[str], homes: Path, network: TaskNetwork | None = None
    ) -> None:
        super().__init__(nodes)
        self.homes = homes
        self.python = _python_on_path(homes.parent / "bin")
        # The tasks' network namespace; None: they run on this machine's.
        self.network = network

    def home(self, node: str) -> Path:
        home = self.homes / node
        if not home.is_dir():
            raise RemoteError(f"{node}: local node folder {home} is missing; run `deploy.py up`")
        return home

    def local_folder(self, node: str) -> Path | None:
        return self.home(node)

    def layout(self, node: str) -> NodeLayout:
        return NodeLayout(
            root="tfcluster",
            code=str(PROJECT_ROOT),
            python=self.python,
            runs="tfcluster/runs",
            logs="tfcluster/logs",
        )

    def run(self, node: str, command: str, *, timeout: float | None = None) -> CommandResult:
        return self._run(node, ["bash", "-c", command], timeout)

    def run_in_task_network(
        self, node: str, command: str, *, timeout: float | None = None
    ) -> CommandResult:
        argv = self.network.argv(command) if self.network is not None else None
        if argv is None:  # not confined: the launch has warned
            return self.run(node, command, timeout=timeout)
        return self._run(node, argv, timeout)

    def _run(self, node: str, argv: list[str], timeout: float | None) -> CommandResult:
        try:
            done = subprocess.run(
                argv,
                cwd=self.home(node),
                capture_output=True,
                text=True,
                errors="replace",  # a node's output is any bytes; never a crash
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise RemoteError(f"{node}: command timed out after {timeout} s") from None
        except OSError as exc:
            raise _not_started(node, exc) from None
        return CommandResult(node, done.returncode, done.stdout, done.stderr)

    def stream(
        self,
        node: str,
        command: str,
        on_line: Callable[[str], None],
        *,
        timeout: float | None = None,
    ) -> int:
        try:
            proc = subprocess.Popen(
                ["bash", "-c", command],
                cwd=self.home(node),
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                bufsize=1,
            )
        except OSError as exc:
            raise _not_started(node, exc) from None
        with proc:
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    on_line(line.rstrip("\n"))
            except BaseException:
                proc.kill()
                raise
            return proc.wait()

    @contextlib.contextmanager
    def forward(self, node: str, remote_port: int, local_port: int = 0) -> Iterator[int]:
        # The nodes are this machine: their 127.0.0.1 is ours.
        yield remote_port

    def fetch(self, node: str, remote_path: str, local_dir: Path) -> None:
        source = Path(remote_path)
        if not source.is_absolute():
            source = self.home(node) / source
        if not source.is_dir():
            raise RemoteError(f"{node}: {remote_path} does not exist")
        if source.resolve() == Path(local_dir).resolve():
            return
        try:
            # Symlinks are copied as symlinks, never followed: a run folder
            # with `a -> .` and `b -> .` (or `data -> /`) had the copy go on
            # until the disk was full.
            shutil.copytree(source, local_dir, symlinks=True, dirs_exist_ok=True)
        except OSError as exc:  # shutil.Error too: a file in the way, no room
            raise RemoteError(f"{node}: cannot fetch {remote_path}: {str(exc)[:200]}") from None


def _not_started(node: str, exc: OSError) -> RemoteError:
    """bash could not even start: the command (it is bash's argument) is
    over the kernel's limit (a huge job.env value), or bash is missing."""
    return RemoteError(f"{node}: could not run bash: {exc.strerror or exc}")


def _python_on_path(folder: Path) -> str:
    """This Python, as a file named ``python`` whose folder can go first on
    PATH: a user's program says ``python train.py``. A venv's bin has one;
    a bare interpreter such as /usr/bin/python3 may not, and gets a wrapper
    (not a symlink: a symlink would lose the venv, which Python finds next
    to the path it was started as)."""
    here = Path(sys.executable)
    if (here.parent / "python").exists():
        return str(here.parent / "python")
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "python"
    text = f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n"
    if not wrapper.exists() or wrapper.read_text() != text:
        tmp = folder / f".python-{os.getpid()}"
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, wrapper)
    return str(wrapper)


class LocalConfig(Strict):
    """cluster.yaml's ``local`` section (provider: local)."""

    # private: the tasks run in a network namespace of the cluster's own,
    # which other machines cannot reach, and which reaches nothing beyond
    # the tasks. host: on this machine's network, their ports open to any
    # machine that reaches it (warned at up, train and run).
    network: Literal["private", "host"] = "private"


class LocalProvider(NodeProvider):
    """Nodes are folders; 'running' means the folder exists."""

    kind = "local"
    config_section = LocalConfig
    _network: TaskNetwork | None = None
    _ports_given: set[int] | None = None  # by task_port, in this command

    def capabilities(self) -> Capabilities:
        return Capabilities(
            cannot_stop=(
                "the local cluster's nodes are folders and processes on this machine: stopping "
                "them saves nothing (`deploy.py cancel` stops a job, `deploy.py down` removes them)"
            ),
            cannot_self_stop=(
                "provider local: the nodes are processes of this machine; stopping saves nothing"
            ),
            # They run this machine's files, cost nothing and need no setup.
            needs_setup=False,
            up_on_demand=True,
        )

    @property
    def homes(self) -> Path:
        return self.state.dir / "nodes"

    def non_terminated_nodes(self) -> list[Node]:
        return [
            Node(
                name=name,
                state=NodeState.RUNNING,
                status="LOCAL",
                internal_ip="127.0.0.1",
                machine_type=f"local ({os.cpu_count()} cores)",
            )
            for name in self.config.nodes
            if (self.homes / name).is_dir()
        ]

    def create_nodes(self, names: Sequence[str]) -> None:
        for name in names:
            (self.homes / name).mkdir(parents=True, exist_ok=True)

    def start_nodes(self, names: Sequence[str]) -> None:
        self.create_nodes(names)

    def stop_nodes(self, names: Sequence[str]) -> None:
        self._stop_tasks(names)

    def terminate_nodes(self, names: Sequence[str]) -> None:
        self._stop_tasks(names)
        for name in names:
            shutil.rmtree(self.homes / name, ignore_errors=True)

    def _stop_tasks(self, names: Sequence[str]) -> None:
        """Stop whatever tasks still run in these nodes (a --detach job)."""
        transport = self.transport_for([n for n in names if (self.homes / n).is_dir()])
        for name in transport.nodes:
            logs = transport.home(name) / "tfcluster" / "logs"
            tasks = sorted(p.stem for p in logs.glob("*.pid"))
            if tasks:
                transport.run(name, commands.stop_tasks(transport.layout(name), tasks))

    # -- the tasks' network (infra/providers/local_network.py) ------------------------

    def task_network(self) -> TaskNetwork | None:
        """The cluster's network namespace (one object per provider: it is
        looked for once per command); None with ``local.network: host``."""
        section = self.section
        if isinstance(section, LocalConfig) and section.network == "host":
            return None
        if self._network is None:
            self._network = TaskNetwork(self.state.dir, sys.executable)
        return self._network

    def exposure(self) -> str | None:
        """Why the tasks' ports are open to other machines; None when they
        are confined (their namespace is made now if there is none)."""
        network = self.task_network()
        if network is None:
            return "local.network is host in cluster.yaml"
        found = network.ensure()
        return None if isinstance(found, Holder) else found

    def prepare(self) -> None:
        """`up`: the tasks' namespace, or the warning that there is none."""
        why = self.exposure()
        if why is not None:
            log.warning(local_network.open_at_up(why))
        else:
            log.warning(local_network.NO_NETWORK)

    def release(self) -> None:
        """`down`: the namespace ends with its holder."""
        network = self.task_network() or TaskNetwork(self.state.dir, sys.executable)
        network.end()

    def before_tasks(self, program: Program, tasks: Sequence[TaskSpec]) -> None:
        why = self.exposure()
        if why is not None:
            log.warning(local_network.open_at_job(why, [t.port for t in tasks]))
        elif program.builtin:
            self._fill_trainer_data(program, tasks)
        else:
            log.warning(local_network.NO_NETWORK)

    def _fill_trainer_data(self, program: Program, tasks: Sequence[TaskSpec]) -> None:
        """What the built-in trainer would download (MNIST, into its cache),
        fetched here on this machine's network before its tasks start in a
        namespace that has none; nothing when a data folder is given."""
        env = {**os.environ, **dict(program.env), **self.task_env()}
        given = "MNIST_DIR" in env or any(a.split("=")[0] == "--data-dir" for a in program.argv)
        if given or program.argv[:3] != ("python", "-m", "trainer"):
            return
        chief = next(t.node for t in tasks if t.type == "chief")
        transport = self.transport_for([chief])
        log.info("fetching the trainer's data here: its tasks will have no network")
        env["PYTHONPATH"] = str(PROJECT_ROOT)
        done = subprocess.run(
            # The trainer's own flags: it finds the folder as its tasks will.
            [transport.python, "-m", "trainer.data.prefetch", *program.argv[3:]],
            cwd=transport.home(chief),
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()
            raise JobFailed(
                said[-1].removeprefix("trainer: error: ")
                if said
                else f"could not fetch MNIST (exit code {done.returncode})",
                exit_code=done.returncode,
                hint="`export MNIST_DIR=FOLDER` of the official MNIST files, "
                "or `train --data-dir FOLDER`",
            )

    def transport(self, nodes: Sequence[Node]) -> Transport:
        return self.transport_for([n.name for n in nodes])

    def transport_for(self, names: Sequence[str]) -> LocalTransport:
        return LocalTransport(names, self.homes, self.task_network())

    def task_port(self, node: str, task_type: str, index: int) -> int:
        # Every task shares 127.0.0.1 (the namespace's, or this machine's),
        # so each gets its own free port. The port is released before the
        # task binds it: the kernel may hand the same one out again at once
        # (CI once saw worker-1 and ps-0 given one port), so a port this
        # provider gave already is drawn again. Another program taking it in
        # the window shows up as a readiness failure, not a silent hang.
        if self._ports_given is None:
            self._ports_given = set()
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            if port not in self._ports_given:
                self._ports_given.add(port)
                return port

    def task_env(self) -> dict[str, str]:
        # The tasks run in the node folders, so a relative MNIST_DIR (as CI
        # sets it) must be made absolute from where the user stands.
        mnist = os.environ.get("MNIST_DIR")
        return {"MNIST_DIR": str(Path(mnist).resolve())} if mnist else {}
