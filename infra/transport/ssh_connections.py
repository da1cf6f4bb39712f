"""Connections to the nodes' sshd, as the SSH transport uses them.

``SshConnections`` keeps one Fabric connection per node (and its SFTP
session): opened with the cluster's own key, the host keys checked against
the cluster's pins (``infra/transport/host_keys.py``; a provider's published keys
pinned first), reopened after a drop, and waited for while nodes boot
(``wait_ready``). A connection that fails becomes one ``RemoteError`` line
with its fix (``connect_error``); ``_Unreachable`` says whether waiting
may help.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import paramiko
from fabric import Config, Connection
from paramiko.ssh_exception import (
    AuthenticationException,
    BadHostKeyException,
    NoValidConnectionsError,
    SSHException,
)

from infra.config.loader import ClusterConfig
from infra.errors import ConfigError, HostKeyChanged, RemoteError
from infra.state.folder import ClusterState
from infra.transport.fanout import fan_out, pause
from infra.transport.host_keys import host_key_changed, known_hosts_name, pin_published, trust_pins

if TYPE_CHECKING:
    from infra.transport.host_keys import HostKeys

log = logging.getLogger("tfcluster")

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
    if (unreachable := _network_error(target, timeout, exc)) is not None:
        return unreachable
    if isinstance(exc, SSHException | EOFError):
        return _Unreachable(
            f"{node}: SSH handshake with {where} failed: {exc or type(exc).__name__}",
            hint="sshd may still be starting (retry in a moment), or that port is not sshd",
            retry=True,
        )
    return _Unreachable(f"{node}: cannot connect to {where}: {exc!r}", retry=False)


def _network_error(target: SshTarget, timeout: float, exc: BaseException) -> _Unreachable | None:
    """The error for a failure below SSH (the name, the route, the port);
    None when ``exc`` is not one."""
    node, address = target.node, f"{target.host}:{target.port}"
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
            f"{node}: connection refused at {address}: no sshd listens there",
            hint=(
                "the machine may still be booting (wait and retry), sshd may be stopped, "
                f"or the port is wrong (hosts.{node}.port / ssh.port)"
            ),
            retry=True,
        )
    if isinstance(exc, TimeoutError | socket.timeout):
        return _Unreachable(
            f"{node}: timed out after {timeout:g} s connecting to {address}",
            hint=(
                "the machine is down or unreachable, or a firewall drops port "
                f"{target.port}; a slow link needs a larger ssh.connect_timeout"
            ),
            retry=True,
        )
    if isinstance(exc, NoValidConnectionsError | OSError) and not isinstance(exc, SSHException):
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return _Unreachable(
            f"{node}: cannot reach {address}: {why}",
            hint="check that the machine is up and its address is right",
            retry=True,
        )
    return None


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


class SshConnections:
    """One open connection per node; see the module docstring."""

    def __init__(
        self,
        targets: Mapping[str, SshTarget],
        *,
        config: ClusterConfig,
        state: ClusterState,
        key_file: Path,
        host_keys: Callable[[str], HostKeys | None] | None = None,
        auth_hint: Callable[[], str | None] | None = None,
    ) -> None:
        """``host_keys``: the provider's ``host_keys`` by node name (None:
        trust on first use). ``auth_hint``: the provider's word on why the
        nodes may refuse our key (GCE: OS Login enforced), for that error."""
        self.targets = dict(targets)
        self.config = config
        self.state = state
        self.key_file = Path(key_file)
        self.user = config.ssh.user
        self.connect_timeout = config.ssh.connect_timeout
        self._auth_hint = auth_hint
        self._host_keys = host_keys
        self._pkey: paramiko.PKey | None = None
        self._conns: dict[str, Connection] = {}
        self._sftp: dict[str, paramiko.SFTPClient] = {}
        self._locks = {node: threading.Lock() for node in self.targets}
        self.aliases: dict[str, str | None] = {}  # node -> its pin's name once resolved

    def target(self, node: str) -> SshTarget:
        try:
            return self.targets[node]
        except KeyError:
            raise RemoteError(f"{node}: not a node of this transport") from None

    def _key(self) -> paramiko.PKey:
        if self._pkey is None:
            self._pkey = load_private_key(self.key_file)
        return self._pkey

    def get(self, node: str) -> Connection:
        """The node's open connection (opened, or reopened after a drop)."""
        target = self.target(node)
        with self._locks[node]:
            conn = self._conns.get(node)
            if conn is not None and conn.is_connected:
                return conn
            if conn is not None:
                self.drop(node)
            self._pin_published(node)
            conn = self._new_connection(target)
            try:
                conn.open()
            except HostKeyChanged:
                conn.close()
                raise
            except BadHostKeyException as exc:
                conn.close()
                name = self.aliases.get(node) or known_hosts_name(target.host, target.port)
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

    def _pin_published(self, node: str) -> None:
        """Before the first connection to ``node``: pin the host keys its
        provider publishes (once per node; see infra/transport/host_keys.py)."""
        if self._host_keys is None or node in self.aliases:
            return
        self.aliases[node] = pin_published(
            self.state.known_hosts, node, self._host_keys, self.config.ssh.boot_timeout
        )

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
        trust_pins(
            conn.client,
            self.state.known_hosts,
            target.node,
            known_hosts_name(target.host, target.port),
            self.aliases.get(target.node),
        )
        return conn

    def sftp(self, node: str) -> paramiko.SFTPClient:
        """The node's SFTP session (opened once per connection)."""
        conn = self.get(node)
        with self._locks[node]:
            client = self._sftp.get(node)
            if client is None:
                try:
                    client = conn.client.open_sftp()
                except (SSHException, OSError, EOFError) as exc:
                    raise RemoteError(f"{node}: cannot open SFTP: {exc}") from None
                self._sftp[node] = client
            return client

    def drop(self, node: str) -> None:
        """Close the node's connection (and SFTP); the next use reopens it."""
        sftp = self._sftp.pop(node, None)
        if sftp is not None:
            with contextlib.suppress(Exception):
                sftp.close()
        conn = self._conns.pop(node, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        """Close every connection."""
        for node in list(self._conns):
            self.drop(node)

    def lost(self, node: str) -> bool:
        """Whether the node has no live connection (it went away mid-command)."""
        conn = self._conns.get(node)
        return conn is None or not conn.is_connected

    def wait_ready(self, names: Sequence[str], timeout: float | None = None) -> None:
        """Connect to every node of ``names``, retrying while they boot
        (refused, timed out, handshake cut short, key not yet authorized)
        until ``timeout`` (default ``ssh.boot_timeout``). One ``RemoteError`` names every node
        that never came up and why; a changed host key fails at once."""
        limit = self.config.ssh.boot_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit

        def wait(node: str) -> None:
            delay = 0.5
            first_auth: float | None = None
            while True:
                try:
                    self.get(node)
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
                pause(delay)  # ends at once when the command is interrupted
                delay = min(delay * 1.5, 5.0)

        failures = fan_out(wait, names).errors
        if not failures:
            return
        changed = [e for e in failures.values() if isinstance(e, HostKeyChanged)]
        if changed:
            raise changed[0]
        down = ", ".join(sorted(failures))
        hint = next((e.hint for e in failures.values() if e.hint), None)
        refused = any(isinstance(e, _Unreachable) and e.auth for e in failures.values())
        if refused and self._auth_hint is not None:
            hint = self._auth_hint() or hint
        raise RemoteError(
            f"{down} did not accept SSH within {limit:g} s: "
            + "; ".join(str(failures[n]) for n in sorted(failures)),
            hint=hint,
        )
