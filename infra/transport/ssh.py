"""``SshTransport``: the nodes' shell over SSH (providers ssh and gce).

Commands run with Fabric (one cached connection per node, reopened when it
drops); long-running ones (``tail -F``) are streamed over a raw channel
(``infra/transport/ssh_stream.py``) so each line reaches the caller as it arrives;
files move with SFTP, or with rsync over the very same SSH settings when
both ends have it.

Every connection trusts only the cluster's pinned host keys
(``infra/transport/host_keys.py``); what a fetch lets a node write here is checked in
``infra/transport/fetch.py``. Nothing here reads ``~/.ssh/known_hosts``,
``~/.ssh/config`` or an agent: a cluster logs in with its own key and
trusts only its own pins, and the system ``ssh`` (``interactive``, rsync's
transport) is pointed at the same key and pins with
``StrictHostKeyChecking=yes``.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import paramiko
from fabric import Connection
from invoke.exceptions import CommandTimedOut, ThreadException
from paramiko.ssh_exception import SSHException

from infra.config.loader import ClusterConfig
from infra.errors import FetchLimitExceeded, RemoteError, combine_errors
from infra.state.folder import ClusterState
from infra.transport.base import CommandResult, NodeLayout, Transport, free_local_port
from infra.transport.fanout import fan_out
from infra.transport.fetch import fetch_staged, rsync_fetch_args, run_watched, sftp_fetch, silent
from infra.transport.host_keys import SSH_HOST_KEY_REFUSED, host_key_changed, known_hosts_name
from infra.transport.ssh_connections import SshConnections, SshTarget
from infra.transport.ssh_stream import follow
from infra.transport.system_ssh import system_ssh_argv

if TYPE_CHECKING:
    from infra.transport.host_keys import HostKeys

log = logging.getLogger("tfcluster")
# rsync's exit codes for a peer silent past --timeout (RERR_TIMEOUT, RERR_CONTIMEOUT).
RSYNC_TIMED_OUT, RSYNC_CONNECT_TIMED_OUT = 30, 35
# Paramiko logs every failed handshake (a booting node's closed banner) with
# a traceback at ERROR; each failure reaches the user once, as a RemoteError
# with its fix, so its own log is kept to what is fatal.
logging.getLogger("paramiko.transport").setLevel(logging.CRITICAL)


class SshTransport(Transport):
    """Runs bash on the nodes over SSH; see the module docstring."""

    def __init__(
        self,
        targets: Sequence[SshTarget],
        *,
        config: ClusterConfig,
        state: ClusterState,
        key_file: Path,
        host_keys: Callable[[str], HostKeys | None] | None = None,
        auth_hint: Callable[[], str | None] | None = None,
        root: str | None = None,
    ) -> None:
        """``host_keys``: the provider's ``host_keys`` by node name (None:
        trust on first use). ``auth_hint``: the provider's word on why the
        nodes may refuse our key (GCE: OS Login enforced), for that error.
        ``root``: the cluster's folder on the nodes (default
        ``setup.remote_dir``; provider ssh: a folder of the cluster's own in
        it, as other clusters may share the login)."""
        super().__init__([t.node for t in targets])
        self.root = (root or config.setup.remote_dir).rstrip("/") or "."
        self.targets = {t.node: t for t in targets}
        self.config = config
        self.state = state
        self.key_file = Path(key_file)
        self.user = config.ssh.user
        self.connect_timeout = config.ssh.connect_timeout
        self._rsync: dict[str, bool] = {}
        # Folders write_private has made 0700, per node, for this transport's life.
        self._private_dirs: dict[str, set[str]] = {}
        self.connections = SshConnections(
            self.targets,
            config=config,
            state=state,
            key_file=self.key_file,
            host_keys=host_keys,
            auth_hint=auth_hint,
        )

    # -- paths ---------------------------------------------------------------

    def layout(self, node: str) -> NodeLayout:
        self.target(node)
        root = self.root
        # The venv is setup.remote_dir's: the clusters of a login share one
        # install (a TensorFlow install per cluster: minutes and gigabytes).
        shared = self.config.setup.remote_dir.rstrip("/") or "."
        return NodeLayout(
            root=root,
            code=f"{root}/code",
            python=f"{shared}/venv/bin/python",
            runs=f"{root}/runs",
            logs=f"{root}/logs",
            shared=shared if shared != root else None,
        )

    def target(self, node: str) -> SshTarget:
        return self.connections.target(node)

    # -- connections (infra/transport/ssh_connections.py) -----------------------------------

    def connection(self, node: str) -> Connection:
        """The node's open connection (opened, or reopened after a drop)."""
        return self.connections.get(node)

    def sftp(self, node: str) -> paramiko.SFTPClient:
        return self.connections.sftp(node)

    def _drop(self, node: str) -> None:
        self.connections.drop(node)

    def _lost(self, node: str) -> bool:
        return self.connections.lost(node)

    def close(self) -> None:
        self.connections.close()

    def __enter__(self) -> SshTransport:
        return self

    def wait_ready(self, timeout: float | None = None, nodes: Sequence[str] | None = None) -> None:
        """Connect to every node (or those of ``nodes``), retrying while they
        boot, until ``timeout`` (default ``ssh.boot_timeout``); see
        ``SshConnections.wait_ready``."""
        self.connections.wait_ready(list(self.nodes if nodes is None else nodes), timeout)

    # -- commands -----------------------------------------------------------------

    @staticmethod
    def wrap(command: str) -> str:
        """The command line sshd runs: bash, whatever the login shell is."""
        return "bash -c " + shlex.quote(command)

    def run(self, node: str, command: str, *, timeout: float | None = None) -> CommandResult:
        conn = self.connection(node)
        started = time.monotonic()
        try:
            result = conn.run(
                self.wrap(command),
                hide=True,
                warn=True,
                in_stream=False,
                pty=False,
                timeout=timeout,
            )
        except CommandTimedOut:
            raise RemoteError(f"{node}: command timed out after {timeout:g} s") from None
        except (ThreadException, SSHException, OSError, EOFError) as exc:
            self._drop(node)
            raise RemoteError(f"{node}: lost the SSH connection: {exc}") from None
        code = result.exited
        if code == -1 and timeout is not None and time.monotonic() - started >= timeout:
            # invoke's timer closed the channel but lost the race to report
            # it (its thread still ran when the result was made).
            raise RemoteError(f"{node}: command timed out after {timeout:g} s")
        if code == -1 and self._lost(node):
            # No exit status and a dead transport: the node went away mid-command.
            self._drop(node)
            raise RemoteError(f"{node}: lost the SSH connection while the command ran")
        return CommandResult(node, code, result.stdout, result.stderr)

    def stream(
        self,
        node: str,
        command: str,
        on_line: Callable[[str], None],
        *,
        timeout: float | None = None,
    ) -> int:
        conn = self.connection(node)
        assert conn.transport is not None
        return follow(
            node,
            conn.transport,
            self.wrap(command),
            on_line,
            timeout=timeout,
            drop=lambda: self._drop(node),
        )

    def run_all(
        self,
        commands: Mapping[str, str],
        *,
        timeout: float | None = None,
        in_task_network: bool = False,
    ) -> dict[str, CommandResult]:
        """One command per node, in parallel; every unreachable node is
        named in one error (a changed host key keeps its own type). A
        node's tasks share its network: ``in_task_network`` changes nothing."""
        done = fan_out(lambda node: self.run(node, commands[node], timeout=timeout), commands)
        if done.errors:
            raise combine_errors(done.errors)
        return done.results

    # -- files --------------------------------------------------------------------

    def upload(self, node: str, local: Path | bytes, remote_path: str) -> None:
        """Write a local file (or bytes) to ``remote_path`` (relative to home)."""
        sftp = self.sftp(node)
        try:
            if isinstance(local, bytes):
                with sftp.open(remote_path, "wb") as out:
                    out.set_pipelined(True)
                    out.write(local)
            else:
                sftp.put(str(local), remote_path, confirm=False)
        except OSError as exc:
            raise RemoteError(f"{node}: cannot write {remote_path}: {exc}") from None
        except (SSHException, EOFError) as exc:
            self._drop(node)
            raise RemoteError(f"{node}: lost the SSH connection: {exc}") from None

    def write_private(self, node: str, remote_path: str, data: bytes) -> None:
        """See ``Transport.write_private``; over SFTP: the file is 0600 before
        its first byte. Four round trips (six at a node's first): only a job
        with values of the user's pays them."""
        sftp = self.sftp(node)
        folder = posixpath.dirname(remote_path) or "."
        tmp = f"{remote_path}.{secrets.token_hex(6)}.tmp"
        try:
            if folder not in self._private_dirs.setdefault(node, set()):
                with contextlib.suppress(OSError):  # it exists already
                    sftp.mkdir(folder, 0o700)
                sftp.chmod(folder, 0o700)
                self._private_dirs[node].add(folder)
            try:
                with sftp.open(tmp, "wb") as out:
                    out.chmod(0o600)
                    out.set_pipelined(True)
                    out.write(data)
                sftp.posix_rename(tmp, remote_path)
            except BaseException:
                with contextlib.suppress(OSError, SSHException, EOFError):
                    sftp.remove(tmp)
                raise
        except OSError as exc:
            raise RemoteError(f"{node}: cannot write {remote_path}: {exc}") from None
        except (SSHException, EOFError) as exc:
            self._drop(node)
            raise RemoteError(f"{node}: lost the SSH connection: {exc}") from None

    def has_rsync(self, node: str) -> bool:
        """rsync on both ends (cached per node)."""
        if not self.has_local_rsync():
            return False
        if node not in self._rsync:
            self._rsync[node] = self.run(node, "command -v rsync >/dev/null", timeout=30).ok
        return self._rsync[node]

    def note_rsync(self, node: str, present: bool) -> None:
        """What a setup probe found out, so ``has_rsync`` need not ask again."""
        self._rsync[node] = present

    def ssh_argv(self, node: str, *, batch: bool = True) -> list[str]:
        """The system ssh with this cluster's key and pins, up to the host
        (no command): for rsync's ``-e`` and ``interactive``."""
        target = self.target(node)
        return system_ssh_argv(
            key_file=self.key_file,
            known_hosts=self.state.known_hosts,
            user=self.user,
            port=target.port,
            alias=self.connections.aliases.get(node),
            connect_timeout=self.connect_timeout,
            batch=batch,
        )

    def rsync_remote(self, node: str, path: str) -> str:
        """``user@host:path`` as rsync spells it (IPv6 in brackets)."""
        host = self.target(node).host
        host = f"[{host}]" if ":" in host else host
        return f"{self.user}@{host}:{path}"

    def rsync(self, node: str, args: Sequence[str], *, timeout: float | None = None) -> str:
        """Run local rsync with ``args`` over this node's SSH settings; its stdout."""
        done = self.run_rsync(node, args, timeout=timeout)
        if done.returncode != 0:
            raise _rsync_failed(node, done)
        return done.stdout

    def run_rsync(
        self,
        node: str,
        args: Sequence[str],
        *,
        timeout: float | None = None,
        watch: Callable[[], None] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``rsync`` whatever its exit code; a host key the system ssh
        refused is ``HostKeyChanged``. ``watch``: see ``run_watched``."""
        # Pin the host first through paramiko (first contact records it),
        # so that ssh's StrictHostKeyChecking=yes then finds it.
        self.connection(node)
        argv = ["rsync", "-e", shlex.join(self.ssh_argv(node)), *args]
        try:
            done = run_watched(argv, timeout=timeout, watch=watch)
        except subprocess.TimeoutExpired:
            raise RemoteError(f"{node}: rsync timed out after {timeout:g} s") from None
        if done.returncode != 0 and SSH_HOST_KEY_REFUSED in done.stderr:
            # The paramiko connection above was made with the pinned key;
            # this new one met another (re-created node, or someone in
            # the middle): as refused as it would be by paramiko.
            target = self.target(node)
            name = known_hosts_name(target.host, target.port)
            raise host_key_changed(node, name, self.state.known_hosts, None)
        return done

    def fetch(self, node: str, remote_path: str, local_dir: Path) -> None:
        """The folder ``remote_path`` into ``local_dir``, incrementally: rsync
        when both ends have it, else SFTP copying only files whose size or
        modification time differ.

        The node is not trusted with this machine's files: only plain files
        and folders whose names are one plain path component arrive, each
        inside ``local_dir``. A name with ``/`` or ``..``, a symlink or a
        special file fails the fetch (``UnsafeRemoteEntry`` naming the node
        and the entry) before anything is written for it."""
        local_dir = Path(local_dir)
        local_dir.mkdir(parents=True, exist_ok=True)
        remote = remote_path.rstrip("/") or "/"
        limits = self.config.fetch.limits()
        if self.has_rsync(node):
            check = self.run(node, f"test -d {_word(remote)}", timeout=30)
            if not check.ok:
                raise RemoteError(f"{node}: {remote_path} does not exist")
            source = self.rsync_remote(node, remote + "/")

            def pull(staging: Path, watch: Callable[[], None]) -> None:
                args = rsync_fetch_args(source, staging, local_dir, limits.timeout)
                done = self.run_rsync(node, args, watch=watch)
                if done.returncode in (RSYNC_TIMED_OUT, RSYNC_CONNECT_TIMED_OUT):
                    raise silent(node, remote, limits)
                if done.returncode != 0:
                    raise _rsync_failed(node, done)

            fetch_staged(node, remote, local_dir, pull, limits)
            return
        try:
            sftp_fetch(node, self.sftp(node), remote, remote_path, local_dir, limits)
        except FetchLimitExceeded:
            self._drop(node)  # answers to what was asked may still come
            raise
        except (SSHException, EOFError) as exc:
            self._drop(node)
            raise RemoteError(f"{node}: lost the SSH connection while fetching: {exc}") from None

    # -- a port of the node, here -------------------------------------------------

    @contextlib.contextmanager
    def forward(self, node: str, remote_port: int, local_port: int = 0) -> Iterator[int]:
        """``remote_port`` of the node's 127.0.0.1 on a port of this
        machine's 127.0.0.1 (``ssh -L``), through the node's connection
        (its pinned host key); only this machine can use the tunnel."""
        conn = self.connection(node)
        port = free_local_port(local_port)
        try:
            with conn.forward_local(
                port, remote_port, remote_host="127.0.0.1", local_host="127.0.0.1"
            ):
                _wait_listening(node, port)
                yield port
        except ThreadException as exc:
            raise RemoteError(f"{node}: the tunnel to port {remote_port} failed: {exc}") from None

    # -- a shell for the user ----------------------------------------------------

    def interactive(self, node: str) -> int | None:
        """An interactive login shell on ``node`` with the system ssh (the
        cluster key, the pinned host key); returns ssh's exit code."""
        # Waits while the node boots; pins its host key on first contact, so
        # that ssh's StrictHostKeyChecking finds it; fails clearly otherwise.
        self.wait_ready(nodes=[node])
        ssh = shutil.which("ssh")
        if ssh is None:
            raise RemoteError(
                "no ssh client here: install OpenSSH (apt-get install openssh-client)"
            )
        target = self.target(node)
        argv = self.ssh_argv(node, batch=False)
        argv[0] = ssh
        tty = ["-t"] if sys.stdin.isatty() else []
        return subprocess.call([*argv, *tty, target.host])


# How long Fabric's tunnel thread may take to bind its local port.
TUNNEL_LISTEN_S = 10.0


def _wait_listening(node: str, port: int) -> None:
    """Until the tunnel's local port accepts a connection. Fabric binds it
    in the tunnel's own thread, after ``forward_local`` has returned: a URL
    handed out at once was sometimes refused (seen in CI). The probe's
    connection goes through to the node and is closed at once."""
    deadline = time.monotonic() + TUNNEL_LISTEN_S
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RemoteError(
                    f"{node}: the tunnel's local port {port} did not open "
                    f"in {TUNNEL_LISTEN_S:.0f} s"
                ) from None
            time.sleep(0.02)


def _rsync_failed(node: str, done: subprocess.CompletedProcess[str]) -> RemoteError:
    tail = " | ".join(done.stderr.strip().splitlines()[-3:])
    return RemoteError(f"{node}: rsync failed (exit {done.returncode}): {tail}")


def _word(path: str) -> str:
    """A remote path as a bash word: absolute as is, relative from home."""
    return shlex.quote(path)
