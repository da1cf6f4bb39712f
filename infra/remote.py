"""``SshTransport``: the nodes' shell over SSH (providers ssh and gce).

Commands run with Fabric (one cached connection per node, reopened when it
drops); long-running ones (``tail -F``) are streamed over a raw channel so
each line reaches the caller as it arrives; files move with SFTP, or with
rsync over the very same SSH settings when both ends have it.

Host keys are pinned per cluster in ``ClusterState.known_hosts`` (OpenSSH
format): an unknown host is recorded on first contact (``PinningPolicy``),
a known host that presents another key is refused with ``HostKeyChanged``.
Nothing here reads ``~/.ssh/known_hosts``, ``~/.ssh/config`` or an agent:
a cluster logs in with its own key and trusts only its own pins, and the
system ``ssh`` (``interactive``, rsync's transport) is pointed at the same
key and pins with ``StrictHostKeyChecking=yes``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TypeVar

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut, ThreadException
from paramiko.hostkeys import HostKeyEntry
from paramiko.ssh_exception import (
    AuthenticationException,
    BadHostKeyException,
    NoValidConnectionsError,
    SSHException,
)

from infra.config import ClusterConfig
from infra.errors import ConfigError, HostKeyChanged, RemoteError
from infra.state import ClusterState
from infra.transport import CommandResult, NodeLayout, Transport

log = logging.getLogger("tfcluster")
# Paramiko logs every failed handshake (a booting node's closed banner) with
# a traceback at ERROR; each failure reaches the user once, as a RemoteError
# with its fix, so its own log is kept to what is fatal.
logging.getLogger("paramiko.transport").setLevel(logging.CRITICAL)
_T = TypeVar("_T")

# The known_hosts file is shared by every connection of this process (and by
# other tfcluster processes of the same cluster): writes are serialised.
_PIN_LOCK = threading.Lock()

# While a node boots, sshd may accept keys only after the guest agent has
# installed them: an authentication failure is retried this long before it
# counts as final (a wrong key should not make the user wait boot_timeout).
AUTH_GRACE_S = 30.0


@dataclass(frozen=True)
class SshTarget:
    """Where this machine reaches one node's sshd."""

    node: str
    host: str
    port: int = 22


# -- host keys -------------------------------------------------------------------


def known_hosts_name(host: str, port: int) -> str:
    """The host's name in known_hosts, as OpenSSH writes it."""
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    """``SHA256:...``, as ``ssh-keygen -lf`` prints it."""
    return key.fingerprint


def forget_host(known_hosts: Path, host: str, port: int = 22) -> bool:
    """Remove the pinned keys of ``host:port`` (after a node was re-created);
    returns whether there was any. Backs ``deploy.py forget-host``."""
    name = known_hosts_name(host, port)
    with _pinned_file(known_hosts):
        try:
            lines = known_hosts.read_text().splitlines(keepends=True)
        except FileNotFoundError:
            return False
        kept = []
        for line in lines:
            entry = HostKeyEntry.from_line(line)
            if entry is not None and any(_host_matches(h, name) for h in entry.hostnames):
                continue
            kept.append(line)
        if len(kept) == len(lines):
            return False
        _atomic_write(known_hosts, "".join(kept))
        return True


def _host_matches(pattern: str, name: str) -> bool:
    """A known_hosts hostname field (plain or hashed) against ``name``."""
    if pattern.startswith("|1|"):
        return paramiko.HostKeys.hash_host(name, pattern) == pattern
    return pattern == name


@contextlib.contextmanager
def _pinned_file(known_hosts: Path) -> Iterator[None]:
    """Exclusive use of ``known_hosts``: threads here and other processes."""
    known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _PIN_LOCK, open(known_hosts.with_name(known_hosts.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def host_key_changed(
    node: str, name: str, known_hosts: Path, offered: paramiko.PKey
) -> HostKeyChanged:
    return HostKeyChanged(
        f"{node}: the host key of {name} is not the one pinned on first contact "
        f"(it now offers {offered.get_name()} {fingerprint(offered)}); refusing to connect",
        hint=(
            f"if {node} was re-created, forget its old key: "
            f"ssh-keygen -R '{name}' -f {known_hosts} ; otherwise someone may be "
            "intercepting the connection"
        ),
    )


class PinningPolicy(paramiko.MissingHostKeyPolicy):
    """Trust on first use, per cluster.

    Paramiko calls this only for a host with no key in the client's loaded
    known_hosts. The file is re-read under a lock first (another thread or
    process may have pinned the host meanwhile): a host found there with a
    different key is refused; a host found nowhere is recorded and accepted.
    """

    def __init__(self, known_hosts: Path, node: str) -> None:
        self.known_hosts = known_hosts
        self.node = node

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        with _pinned_file(self.known_hosts):
            pinned = paramiko.HostKeys()
            if self.known_hosts.exists():
                pinned.load(str(self.known_hosts))
            known = pinned.lookup(hostname)
            if known is not None:
                # Any key on record, of this type or another, must match:
                # a host that switched key types is a changed host too.
                if known.get(key.get_name()) != key:
                    raise host_key_changed(self.node, hostname, self.known_hosts, key)
            else:
                with open(self.known_hosts, "a") as out:
                    os.chmod(self.known_hosts, 0o600)
                    # The node's name as the comment: says which line is whose.
                    out.write(f"{hostname} {key.get_name()} {key.get_base64()} {self.node}\n")
                log.info("%s: pinned host key %s %s", self.node, key.get_name(), fingerprint(key))
        client.get_host_keys().add(hostname, key.get_name(), key)


# -- connection errors -----------------------------------------------------------


class _Unreachable(RemoteError):
    """A connection failure; ``retry`` says whether waiting may fix it."""

    def __init__(self, message: str, *, hint: str | None = None, retry: bool, auth: bool = False):
        super().__init__(message, hint=hint)
        self.retry = retry
        self.auth = auth


def connect_error(
    target: SshTarget, user: str, key_file: Path, timeout: float, exc: BaseException
) -> RemoteError:
    """The one-line error (with its fix) for failing to reach ``target``."""
    where = f"{user}@{target.host}:{target.port}"
    node = target.node
    if isinstance(exc, HostKeyChanged):
        return exc
    if isinstance(exc, AuthenticationException):
        return _Unreachable(
            f"{node}: authentication failed for {where} with key {key_file}",
            hint=(
                f"the node must list {key_file}.pub in ~{user}/.ssh/authorized_keys "
                "(`deploy.py up` does so on GCE; on your own hosts add it yourself), "
                "or set ssh.key_file / ssh.user to a login the node accepts"
            ),
            retry=True,
            auth=True,
        )
    if isinstance(exc, socket.gaierror):
        return _Unreachable(
            f"{node}: unknown host {target.host!r}: the name does not resolve",
            hint=f"fix hosts.{node}.address in cluster.yaml (a name or IP this machine resolves)",
            retry=False,
        )
    refused = isinstance(exc, ConnectionRefusedError) or (
        isinstance(exc, NoValidConnectionsError)
        and all(getattr(e, "errno", None) == errno.ECONNREFUSED for e in exc.errors.values())
    )
    if refused:
        return _Unreachable(
            f"{node}: connection refused at {target.host}:{target.port}: no sshd listens there",
            hint=(
                "the machine may still be booting (wait and retry), sshd may be stopped, "
                f"or the port is wrong (hosts.{node}.port / ssh.port)"
            ),
            retry=True,
        )
    if isinstance(exc, TimeoutError | socket.timeout):
        return _Unreachable(
            f"{node}: timed out after {timeout:g} s connecting to {target.host}:{target.port}",
            hint=(
                "the machine is down or unreachable, or a firewall drops port "
                f"{target.port}; a slow link needs a larger ssh.connect_timeout"
            ),
            retry=True,
        )
    if isinstance(exc, NoValidConnectionsError | OSError) and not isinstance(exc, SSHException):
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return _Unreachable(
            f"{node}: cannot reach {target.host}:{target.port}: {why}",
            hint="check that the machine is up and its address is right",
            retry=True,
        )
    if isinstance(exc, SSHException | EOFError):
        return _Unreachable(
            f"{node}: SSH handshake with {where} failed: {exc or type(exc).__name__}",
            hint="sshd may still be starting (retry in a moment), or that port is not sshd",
            retry=True,
        )
    return _Unreachable(f"{node}: cannot connect to {where}: {exc!r}", retry=False)


# -- the transport -----------------------------------------------------------------


def load_private_key(key_file: Path) -> paramiko.PKey:
    try:
        return paramiko.PKey.from_path(key_file)
    except FileNotFoundError:
        raise ConfigError(f"ssh key {key_file} does not exist") from None
    except paramiko.PasswordRequiredException:
        raise ConfigError(
            f"ssh key {key_file} is protected by a passphrase; tfcluster needs an "
            "unencrypted key (remove ssh.key_file to use a per-cluster key)"
        ) from None
    except (SSHException, ValueError) as exc:
        raise ConfigError(f"ssh key {key_file} cannot be read: {exc}") from None


class _Liveness:
    """Tells a quiet connection from a dead one while a stream waits.

    A node that stops (or loses its network) without closing the TCP
    connection leaves nothing to read and nothing to fail: keepalives sit
    in the send buffer for the kernel's retransmission timeout (many
    minutes). After ``QUIET_S`` without output, a keepalive that asks for a
    reply goes out on a thread; no reply within ``REPLY_S`` means the node
    is gone.
    """

    QUIET_S = 15.0
    REPLY_S = 15.0

    def __init__(self, transport: paramiko.Transport) -> None:
        self.transport = transport
        self.last = time.monotonic()
        self.probe: threading.Thread | None = None
        self.probe_sent = 0.0

    def heard(self) -> None:
        self.last = time.monotonic()

    def silent_s(self) -> float:
        return time.monotonic() - self.last

    def check(self) -> bool:
        """False once the node has not answered a probe in time."""
        now = time.monotonic()
        if self.probe is not None:
            if not self.probe.is_alive():
                self.probe = None
                self.last = now  # it answered
            elif now - self.probe_sent > self.REPLY_S:
                return False
            return True
        if now - self.last > self.QUIET_S:
            self.probe_sent = now
            self.probe = threading.Thread(
                target=self.transport.global_request,
                args=("keepalive@openssh.com",),
                kwargs={"wait": True},
                daemon=True,
            )
            self.probe.start()
        return True


class SshTransport(Transport):
    """Runs bash on the nodes over SSH; see the module docstring."""

    def __init__(
        self,
        targets: Sequence[SshTarget],
        *,
        config: ClusterConfig,
        state: ClusterState,
        key_file: Path,
    ) -> None:
        super().__init__([t.node for t in targets])
        self.targets = {t.node: t for t in targets}
        self.config = config
        self.state = state
        self.key_file = Path(key_file)
        self.user = config.ssh.user
        self.connect_timeout = config.ssh.connect_timeout
        self._pkey: paramiko.PKey | None = None
        self._conns: dict[str, Connection] = {}
        self._sftp: dict[str, paramiko.SFTPClient] = {}
        self._rsync: dict[str, bool] = {}
        self._locks = {t.node: threading.Lock() for t in targets}

    # -- paths ---------------------------------------------------------------

    def layout(self, node: str) -> NodeLayout:
        self.target(node)
        root = self.config.setup.remote_dir.rstrip("/") or "."
        return NodeLayout(
            root=root,
            code=f"{root}/code",
            python=f"{root}/venv/bin/python",
            runs=f"{root}/runs",
            logs=f"{root}/logs",
        )

    def target(self, node: str) -> SshTarget:
        try:
            return self.targets[node]
        except KeyError:
            raise RemoteError(f"{node}: not a node of this transport") from None

    # -- connections -------------------------------------------------------------

    def _key(self) -> paramiko.PKey:
        if self._pkey is None:
            self._pkey = load_private_key(self.key_file)
        return self._pkey

    def connection(self, node: str) -> Connection:
        """The node's open connection (opened, or reopened after a drop)."""
        target = self.target(node)
        with self._locks[node]:
            conn = self._conns.get(node)
            if conn is not None and conn.is_connected:
                return conn
            if conn is not None:
                self._drop(node)
            conn = self._new_connection(target)
            try:
                conn.open()
            except HostKeyChanged:
                conn.close()
                raise
            except BadHostKeyException as exc:
                conn.close()
                name = known_hosts_name(target.host, target.port)
                raise host_key_changed(node, name, self.state.known_hosts, exc.key) from None
            except (OSError, SSHException, EOFError) as exc:
                conn.close()
                raise connect_error(
                    target, self.user, self.key_file, self.connect_timeout, exc
                ) from None
            assert conn.transport is not None
            # Keepalives notice a vanished peer (a preempted VM) on idle links.
            conn.transport.set_keepalive(15)
            self._conns[node] = conn
            return conn

    def _new_connection(self, target: SshTarget) -> Connection:
        # An explicit empty SSHConfig: ~/.ssh/config must not redirect a
        # cluster's node (another user, port or ProxyCommand).
        fab_config = Config(ssh_config=paramiko.SSHConfig(), lazy=True)
        conn = Connection(
            target.host,
            user=self.user,
            port=target.port,
            config=fab_config,
            connect_kwargs={
                "pkey": self._key(),
                "look_for_keys": False,
                "allow_agent": False,
                "timeout": self.connect_timeout,
                "banner_timeout": self.connect_timeout,
                "auth_timeout": self.connect_timeout,
            },
        )
        # Replace Fabric's AutoAddPolicy: only the cluster's pins are trusted.
        client = conn.client
        known = self.state.known_hosts
        if known.exists():
            with _pinned_file(known):
                client.get_host_keys().load(str(known))
        client.set_missing_host_key_policy(PinningPolicy(known, target.node))
        return conn

    def _drop(self, node: str) -> None:
        sftp = self._sftp.pop(node, None)
        if sftp is not None:
            with contextlib.suppress(Exception):
                sftp.close()
        conn = self._conns.pop(node, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        for node in list(self._conns):
            self._drop(node)

    def __enter__(self) -> SshTransport:
        return self

    def _lost(self, node: str) -> bool:
        conn = self._conns.get(node)
        return conn is None or not conn.is_connected

    def wait_ready(self, timeout: float | None = None, nodes: Sequence[str] | None = None) -> None:
        """Connect to every node, retrying while they boot (refused, timed
        out, handshake cut short, key not yet authorized) until ``timeout``
        (default ``ssh.boot_timeout``). One ``RemoteError`` names every node
        that never came up and why; a changed host key fails at once."""
        limit = self.config.ssh.boot_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        names = list(nodes) if nodes is not None else list(self.nodes)

        def wait(node: str) -> None:
            delay = 0.5
            first_auth: float | None = None
            while True:
                try:
                    self.connection(node)
                    return
                except _Unreachable as exc:
                    now = time.monotonic()
                    if exc.auth:
                        first_auth = first_auth if first_auth is not None else now
                    if (
                        not exc.retry
                        or now + delay > deadline
                        or (first_auth is not None and now - first_auth > AUTH_GRACE_S)
                    ):
                        raise
                    log.debug("%s not ready yet: %s", node, exc)
                time.sleep(delay)
                delay = min(delay * 1.5, 5.0)

        failures: dict[str, RemoteError] = {}
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(names)))) as pool:
            futures = {node: pool.submit(wait, node) for node in names}
            for node, future in futures.items():
                try:
                    future.result()
                except RemoteError as exc:
                    failures[node] = exc
        if not failures:
            return
        changed = [e for e in failures.values() if isinstance(e, HostKeyChanged)]
        if changed:
            raise changed[0]
        down = ", ".join(sorted(failures))
        raise RemoteError(
            f"{down} did not accept SSH within {limit:g} s: "
            + "; ".join(str(failures[n]) for n in sorted(failures)),
            hint=next((e.hint for e in failures.values() if e.hint), None),
        )

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
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            chan = conn.transport.open_session()
        except (SSHException, OSError, EOFError) as exc:
            self._drop(node)
            raise RemoteError(f"{node}: lost the SSH connection: {exc}") from None
        stderr: list[bytes] = []

        def drain_stderr() -> None:
            # stdout and stderr share one flow-control window: an unread
            # stderr would stall stdout. Keep only its tail, for errors.
            while True:
                data = chan.recv_stderr(32768)
                if not data:
                    return
                stderr.append(data)
                del stderr[:-16]

        try:
            chan.exec_command(self.wrap(command))
            chan.shutdown_write()
            reader = threading.Thread(target=drain_stderr, daemon=True)
            reader.start()
            buffer = b""
            chan.settimeout(0.5)
            liveness = _Liveness(conn.transport)
            while True:
                if deadline is not None and time.monotonic() > deadline:
                    raise RemoteError(f"{node}: command timed out after {timeout:g} s")
                try:
                    data = chan.recv(65536)
                except TimeoutError:
                    if not conn.transport.is_active():
                        break
                    if not liveness.check():
                        self._drop(node)
                        raise RemoteError(
                            f"{node}: no answer for {liveness.silent_s():.0f} s: the node "
                            "stopped or the network to it is down"
                        ) from None
                    continue
                if not data:
                    break
                liveness.heard()
                buffer += data
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    on_line(line.decode("utf-8", "replace").rstrip("\r"))
            if buffer:
                on_line(buffer.decode("utf-8", "replace").rstrip("\r"))
            if not chan.exit_status_ready() and not conn.transport.is_active():
                raise RemoteError(f"{node}: lost the SSH connection while following the output")
            chan.settimeout(None)
            code = chan.recv_exit_status()
            reader.join(1.0)
            if code == -1 and not conn.transport.is_active():
                raise RemoteError(f"{node}: lost the SSH connection while following the output")
            return code
        except (SSHException, OSError, EOFError) as exc:
            self._drop(node)
            raise RemoteError(f"{node}: lost the SSH connection: {exc}") from None
        finally:
            chan.close()

    def run_all(
        self, commands: Mapping[str, str], *, timeout: float | None = None
    ) -> dict[str, CommandResult]:
        """One command per node, in parallel; every unreachable node is
        named in one error (a changed host key keeps its own type)."""
        results, failures = self.map(
            lambda node: self.run(node, commands[node], timeout=timeout), list(commands)
        )
        if failures:
            raise combine_errors(failures)
        return results

    def map(
        self, fn: Callable[[str], _T], nodes: Sequence[str]
    ) -> tuple[dict[str, _T], dict[str, RemoteError]]:
        """``fn(node)`` on every node at once: results and RemoteErrors by node."""
        results: dict[str, _T] = {}
        failures: dict[str, RemoteError] = {}
        if not nodes:
            return results, failures
        with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
            futures = {node: pool.submit(fn, node) for node in nodes}
            for node, future in futures.items():
                try:
                    results[node] = future.result()
                except RemoteError as exc:
                    failures[node] = exc
        return results, failures

    # -- files --------------------------------------------------------------------

    def sftp(self, node: str) -> paramiko.SFTPClient:
        conn = self.connection(node)
        with self._locks[node]:
            client = self._sftp.get(node)
            if client is None:
                try:
                    client = conn.client.open_sftp()
                except (SSHException, OSError, EOFError) as exc:
                    raise RemoteError(f"{node}: cannot open SFTP: {exc}") from None
                self._sftp[node] = client
            return client

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

    @staticmethod
    def has_local_rsync() -> bool:
        return shutil.which("rsync") is not None

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
        argv = [
            "ssh",
            "-i", str(self.key_file),
            "-p", str(target.port),
            "-l", self.user,
            "-o", "IdentitiesOnly=yes",
            "-o", "IdentityAgent=none",
            "-o", f"UserKnownHostsFile={self.state.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes",
            "-o", "HashKnownHosts=no",
            "-o", f"ConnectTimeout={max(1, round(self.connect_timeout))}",
            "-o", "ServerAliveInterval=15",
            "-F", "/dev/null",
        ]  # fmt: skip
        if batch:
            argv += ["-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]
            # rsync opens a connection per call: OpenSSH's default hybrid
            # post-quantum key exchange adds ~0.1 s of CPU to each, which on
            # small nodes is most of a no-op sync. X25519 is what the
            # paramiko connections (every command) use anyway.
            argv += ["-o", "KexAlgorithms=curve25519-sha256,curve25519-sha256@libssh.org"]
        return argv

    def rsync_remote(self, node: str, path: str) -> str:
        """``user@host:path`` as rsync spells it (IPv6 in brackets)."""
        host = self.target(node).host
        host = f"[{host}]" if ":" in host else host
        return f"{self.user}@{host}:{path}"

    def rsync(self, node: str, args: Sequence[str], *, timeout: float | None = None) -> str:
        """Run local rsync with ``args`` over this node's SSH settings; its stdout."""
        # Pin the host first through paramiko (first contact records it),
        # so that ssh's StrictHostKeyChecking=yes then finds it.
        self.connection(node)
        argv = ["rsync", "-e", shlex.join(self.ssh_argv(node)), *args]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            raise RemoteError(f"{node}: rsync timed out after {timeout:g} s") from None
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise RemoteError(f"{node}: rsync failed (exit {done.returncode}): {tail}")
        return done.stdout

    def fetch(self, node: str, remote_path: str, local_dir: Path) -> None:
        """The folder ``remote_path`` into ``local_dir``, incrementally: rsync
        when both ends have it, else SFTP copying only files whose size or
        modification time differ."""
        local_dir = Path(local_dir)
        local_dir.mkdir(parents=True, exist_ok=True)
        remote = remote_path.rstrip("/") or "/"
        if self.has_rsync(node):
            check = self.run(node, f"test -d {_word(remote)}", timeout=30)
            if not check.ok:
                raise RemoteError(f"{node}: {remote_path} does not exist")
            self.rsync(node, ["-a", self.rsync_remote(node, remote + "/"), f"{local_dir}/"])
            return
        sftp = self.sftp(node)
        try:
            if not stat.S_ISDIR(sftp.stat(remote).st_mode or 0):
                raise RemoteError(f"{node}: {remote_path} is not a folder")
        except FileNotFoundError:
            raise RemoteError(f"{node}: {remote_path} does not exist") from None
        try:
            _sftp_get_tree(sftp, remote, local_dir)
        except (SSHException, EOFError) as exc:
            self._drop(node)
            raise RemoteError(f"{node}: lost the SSH connection while fetching: {exc}") from None
        except OSError as exc:
            raise RemoteError(f"{node}: cannot fetch {remote_path}: {exc}") from None

    # -- a shell for the user ----------------------------------------------------

    def interactive(self, node: str) -> int:
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


def _word(path: str) -> str:
    """A remote path as a bash word: absolute as is, relative from home."""
    return shlex.quote(path)


def _sftp_get_tree(sftp: paramiko.SFTPClient, remote: str, local: Path) -> None:
    for entry in sftp.listdir_attr(remote):
        name = entry.filename
        source = str(PurePosixPath(remote) / name)
        dest = local / name
        mode = entry.st_mode or 0
        if stat.S_ISDIR(mode):
            dest.mkdir(exist_ok=True)
            _sftp_get_tree(sftp, source, dest)
        elif stat.S_ISREG(mode):
            try:
                have = dest.stat()
                if have.st_size == entry.st_size and int(have.st_mtime) == entry.st_mtime:
                    continue
            except FileNotFoundError:
                pass
            sftp.get(source, str(dest))
            if entry.st_mtime is not None:
                os.utime(dest, (entry.st_atime or entry.st_mtime, entry.st_mtime))


def combine_errors(failures: Mapping[str, RemoteError]) -> RemoteError:
    """One error for several nodes; a changed host key wins (its exit code)."""
    for exc in failures.values():
        if isinstance(exc, HostKeyChanged):
            return exc
    if len(failures) == 1:
        return next(iter(failures.values()))
    message = "; ".join(str(failures[n]) for n in sorted(failures))
    hint = next((e.hint for e in failures.values() if e.hint), None)
    return RemoteError(message, hint=hint)


def public_key_main(argv: Sequence[str] | None = None) -> int:
    """``python -m infra.remote public-key --config FILE``: print the public
    key line that logs in to that cluster's nodes (creating the per-cluster
    key on first use). ``make cluster-up`` authorizes it on the containers."""
    import argparse

    from infra.config import load_config
    from infra.keys import cluster_key

    parser = argparse.ArgumentParser(prog="python -m infra.remote")
    sub = parser.add_subparsers(dest="command", required=True)
    pub = sub.add_parser("public-key", help="print the cluster's public key line")
    pub.add_argument("--config", required=True)
    forget = sub.add_parser("forget-host", help="drop a node's pinned host key")
    forget.add_argument("--config", required=True)
    forget.add_argument("node", nargs="?", help="default: every node")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    state = ClusterState(config.name)
    if args.command == "public-key":
        _, line = cluster_key(config.ssh.key_file, state.key_file, f"tfcluster-{config.name}")
        print(line)
        return 0
    nodes = [args.node] if args.node else list(config.nodes)
    for node in nodes:
        host = config.hosts.get(node)
        if host is None:
            continue
        if forget_host(state.known_hosts, host.address, host.port):
            print(f"{node}: forgot the host key of {known_hosts_name(host.address, host.port)}")
    return 0


if __name__ == "__main__":
    sys.exit(public_key_main())
