"""Host-key pinning: which SSH host keys a cluster trusts, in its own known_hosts.

Host keys are pinned per cluster in ``ClusterState.known_hosts`` (OpenSSH
format): an unknown host is recorded on first contact (``PinningPolicy``),
a known host that presents another key is refused with ``HostKeyChanged``.
Where the provider knows a node's keys without asking the node (GCE: guest
attributes over the Compute API, ``GceProvider.host_keys``), they are
pinned before the first connection (``pin_published``), under the
machine's alias (``compute.<id>``) rather than its address, as gcloud does:
no first use to trust, and the pin survives stop/start and a new IP.
Nothing here reads ``~/.ssh/known_hosts``: a cluster trusts only its own
pins (``trust_pins`` sets up a paramiko client so). The SSH transport
(``infra/transport/ssh.py``) uses all this for every connection; ``forget_host``
backs ``deploy.py forget-host``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey
from paramiko.ssh_exception import SSHException

from infra.errors import HostKeyChanged
from infra.transport.fanout import pause

log = logging.getLogger("tfcluster")


@dataclass(frozen=True)
class HostKeys:
    """The SSH host keys a node should present, as its provider learnt them
    over a channel other than SSH itself (GCE: what the guest agent
    publishes in guest attributes, read over the authenticated Compute API).
    """

    # The name they are pinned under in known_hosts: the machine's own
    # identity, not its address, so the pin survives stop/start and a new
    # ephemeral IP (GCE: ``compute.<instance id>``, as gcloud names it).
    alias: str
    # ``"<type> <base64>"`` lines; empty while the node has not published
    # them yet (a GCE guest agent does so some seconds after boot).
    keys: tuple[str, ...] = ()


# The known_hosts file is shared by every connection of this process (and by
# other tfcluster processes of the same cluster): writes are serialised.
_PIN_LOCK = threading.Lock()


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


# What OpenSSH prints (at LogLevel=ERROR too) when StrictHostKeyChecking
# refuses the key a host offers.
SSH_HOST_KEY_REFUSED = "Host key verification failed."


def host_key_changed(
    node: str, name: str, known_hosts: Path, offered: paramiko.PKey | None
) -> HostKeyChanged:
    offers = f" (it now offers {offered.get_name()} {fingerprint(offered)})" if offered else ""
    return HostKeyChanged(
        f"{node}: the host key of {name} is not the one pinned on first contact"
        f"{offers}; refusing to connect",
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

    def __init__(self, known_hosts: Path, node: str, alias: str | None = None) -> None:
        self.known_hosts = known_hosts
        self.node = node
        # Pins under this name instead of the address (see ``pin_host_keys``).
        self.alias = alias

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        name = self.alias or hostname
        with _pinned_file(self.known_hosts):
            pinned = paramiko.HostKeys()
            if self.known_hosts.exists():
                pinned.load(str(self.known_hosts))
            known = pinned.lookup(name)
            if known is not None:
                # Any key on record, of this type or another, must match:
                # a host that switched key types is a changed host too.
                if known.get(key.get_name()) != key:
                    raise host_key_changed(self.node, name, self.known_hosts, key)
            else:
                with open(self.known_hosts, "a") as out:
                    os.chmod(self.known_hosts, 0o600)
                    # The node's name as the comment: says which line is whose.
                    out.write(f"{name} {key.get_name()} {key.get_base64()} {self.node}\n")
                log.info("%s: pinned host key %s %s", self.node, key.get_name(), fingerprint(key))
        client.get_host_keys().add(hostname, key.get_name(), key)


def parse_host_keys(node: str, lines: Sequence[str]) -> list[paramiko.PKey]:
    """``"<type> <base64>"`` lines (from the provider, so from the node:
    data) as keys; a line paramiko cannot read is skipped with a warning."""
    keys = []
    for line in lines:
        try:
            entry = HostKeyEntry.from_line(f"x {line}")
        except (SSHException, InvalidHostKey, ValueError):
            entry = None
        if entry is None:
            log.warning("%s: ignoring an unreadable published host key %r", node, line[:60])
            continue
        keys.append(entry.key)
    return keys


def pinned_keys(known_hosts: Path, name: str) -> dict[str, paramiko.PKey]:
    """The keys pinned under ``name`` (an address or an alias), by type."""
    with _pinned_file(known_hosts):
        pinned = paramiko.HostKeys()
        if known_hosts.exists():
            pinned.load(str(known_hosts))
    found = pinned.lookup(name)
    return dict(found) if found is not None else {}


def pin_host_keys(known_hosts: Path, name: str, keys: Sequence[paramiko.PKey], node: str) -> None:
    """Pin exactly ``keys`` under ``name``, replacing what was pinned there.

    Only for keys vouched for by the provider's API (authenticated, not the
    network path to the node): they are the truth about that machine, so
    they replace an older pin (one taken on first use, say) rather than
    being refused by it."""
    want = {k.get_name(): k for k in keys}
    if not want:
        return
    with _pinned_file(known_hosts):
        try:
            lines = known_hosts.read_text().splitlines(keepends=True)
        except FileNotFoundError:
            lines = []
        kept, before = [], {}
        for line in lines:
            try:
                entry = HostKeyEntry.from_line(line)
            except (SSHException, InvalidHostKey, ValueError):
                entry = None  # not ours to judge: kept as it is
            if entry is not None and any(_host_matches(h, name) for h in entry.hostnames):
                before[entry.key.get_name()] = entry.key
                continue
            kept.append(line)
        if before == want:
            return
        if before:
            log.warning(
                "%s: its published host keys differ from those pinned for %s; pinned the "
                "published ones", node, name,
            )
        kept += [f"{name} {k.get_name()} {k.get_base64()} {node}\n" for k in want.values()]
        _atomic_write(known_hosts, "".join(kept))
    for key in want.values():
        log.info("%s: pinned published host key %s %s", node, key.get_name(), fingerprint(key))


def pin_published(
    known_hosts: Path,
    node: str,
    host_keys: Callable[[str], HostKeys | None],
    boot_timeout: float,
) -> str | None:
    """Before the first connection to ``node``: pin the host keys its
    provider publishes; the alias they are pinned under (None: the provider
    has no such channel for it, so trust on first use, by address)."""
    deadline = time.monotonic() + boot_timeout
    delay = 0.5
    while True:
        published = host_keys(node)
        if published is None:
            return None
        keys = parse_host_keys(node, published.keys)
        if keys:
            pin_host_keys(known_hosts, published.alias, keys, node)
            break
        if pinned_keys(known_hosts, published.alias):
            break  # not published (yet) since a start; pinned on an earlier one
        if time.monotonic() + delay > deadline:
            # The guest agent publishes the keys some seconds after boot;
            # a guest that never does (an image without the agent) must
            # not make the cluster unusable: fall back to trusting the
            # first key it presents (pinned under its alias from then
            # on), as for an ssh host, and say so.
            log.warning(
                "%s: no SSH host keys published in its guest attributes after %g s; "
                "trusting the key it presents now (trust on first use)",
                node, boot_timeout,
            )
            break
        pause(delay)  # ends at once when the command is interrupted
        delay = min(delay * 1.5, 5.0)
    return published.alias


def trust_pins(
    client: paramiko.SSHClient, known_hosts: Path, node: str, address: str, alias: str | None
) -> None:
    """Make ``client`` trust only the cluster's pins (never Fabric's
    AutoAddPolicy): with an ``alias``, only the pins of this machine, under
    the ``address`` name paramiko looks up; else the whole file."""
    if alias:
        for key in pinned_keys(known_hosts, alias).values():
            client.get_host_keys().add(address, key.get_name(), key)
    elif known_hosts.exists():
        with _pinned_file(known_hosts):
            client.get_host_keys().load(str(known_hosts))
    client.set_missing_host_key_policy(PinningPolicy(known_hosts, node, alias))
