"""Instances of the fake GCE that are real hosts: one node container each.

``DockerBackend`` plugs into ``FakeGce(backend=...)``. Creating instance
``pc-N`` starts a container of the node image (sshd, python3, the login
user) on two private docker networks:

* the *VPC* network: the container's fixed address there is the instance's
  ``networkIP``; the job's tasks talk to each other over it (TF_CONFIG);
* the *external* network: an address there is the instance's ``natIP``,
  where this machine reaches sshd, as it reaches a VM's external IP. Like an
  ephemeral external IP it is given when the instance runs, taken away
  when it stops, and a different one after each start.

Stop stops the container (its filesystem survives, as a persistent disk
does: the venv, the synced code, the run folders, the host keys), start
starts it again, delete removes it. The ``ssh-keys`` metadata (``user:key``
lines) is what a guest agent would install: the keys of the image's login
user go to its ``authorized_keys`` at create, at each start and on
``setMetadata``. The guest attributes ``hostkeys/`` are the container's
own /etc/ssh/ssh_host_*_key.pub, read when asked once its sshd runs.

Every container and network carries ``label``; ``close`` removes them all.
"""

from __future__ import annotations

import ipaddress
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.fake_gce.backend import Addresses, InstanceBackend

# PID 1's name (/proc/1/comm) until the node image's entrypoint execs sshd.
ENTRYPOINT = "tfcluster-entrypoint"[:15]  # comm keeps 15 characters
# Host addresses .2-.254 of a /24 (.1 is docker's gateway).
_FIRST_HOST, _LAST_HOST = 2, 254


def docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def ssh_keys_of(instance: dict[str, Any], user: str) -> list[str]:
    """The public keys of ``user`` in the instance's ``ssh-keys`` metadata."""
    items = instance.get("metadata", {}).get("items", [])
    text = next((i.get("value", "") for i in items if i.get("key") == "ssh-keys"), "")
    keys = []
    for line in text.splitlines():
        owner, sep, key = line.strip().partition(":")
        if sep and owner == user and key.strip():
            keys.append(key.strip())
    return keys


class DockerBackend(InstanceBackend):
    def __init__(
        self,
        image: str,
        *,
        prefix: str,
        label: str,
        vpc_subnet: str,
        external_subnet: str,
        keys_dir: Path,
        user: str = "tfcluster",
        command: Sequence[str] = (),
    ) -> None:
        """``vpc_subnet`` and ``external_subnet`` are free /24s (``10.x.y.0/24``);
        ``command`` replaces the node's sshd (a node whose SSH never opens)."""
        self.image = image
        self.prefix = prefix
        self.label = label
        self.user = user
        self.keys_dir = keys_dir
        self.command = list(command)
        self.vpc = f"{prefix}-vpc"
        self.external = f"{prefix}-ext"
        self._vpc_hosts = list(ipaddress.ip_network(vpc_subnet).hosts())
        self._ext_hosts = list(ipaddress.ip_network(external_subnet).hosts())
        self._lock = threading.Lock()
        self._next_vpc = _FIRST_HOST
        self._next_ext = _FIRST_HOST
        self._internal: dict[str, str] = {}  # container -> its VPC address (kept)
        self._events: subprocess.Popen[str] | None = None  # `docker events`, see watch()
        for name, subnet in ((self.vpc, vpc_subnet), (self.external, external_subnet)):
            docker("network", "create", "--label", label, "--subnet", subnet, name)

    # -- naming and addresses ---------------------------------------------------------

    def container(self, instance: dict[str, Any] | str) -> str:
        name = instance if isinstance(instance, str) else instance["name"]
        return f"{self.prefix}-{name}"

    def _take(self, which: str) -> str:
        with self._lock:
            if which == "vpc":
                n, self._next_vpc = self._next_vpc, self._next_vpc + 1
                hosts = self._vpc_hosts
            else:
                # A new external address on every start, as GCE's ephemeral
                # IPs are; wraps around after 253 starts.
                n = self._next_ext
                self._next_ext = n + 1 if n < _LAST_HOST else _FIRST_HOST
                hosts = self._ext_hosts
        if n > _LAST_HOST:
            raise RuntimeError(f"no free address left on {which}")
        return str(hosts[n - 1])

    def _write_keys(self, instance: dict[str, Any]) -> Path:
        folder = self.keys_dir / instance["name"]
        folder.mkdir(parents=True, exist_ok=True)
        keys = ssh_keys_of(instance, self.user)
        (folder / "authorized_keys").write_text("".join(f"{k}\n" for k in keys))
        return folder

    def _attach_external(self, container: str) -> str:
        address = self._take("ext")
        docker("network", "connect", "--ip", address, self.external, container)
        return address

    # -- InstanceBackend ----------------------------------------------------------------

    def on_create(self, instance: dict[str, Any]) -> Addresses:
        name = self.container(instance)
        internal = self._take("vpc")
        keys = self._write_keys(instance)
        docker(
            "create", "--name", name, "--hostname", instance["name"], "--label", self.label,
            "--network", self.vpc, "--ip", internal,
            "-v", f"{keys}:/run/tfcluster:ro", "--stop-timeout", "2",
            self.image, *self.command,
        )  # fmt: skip
        self._internal[name] = internal
        external = self._attach_external(name)
        docker("start", name)
        return Addresses(network_ip=internal, nat_ip=external)

    def on_start(self, instance: dict[str, Any]) -> Addresses:
        name = self.container(instance)
        self._write_keys(instance)
        docker("network", "disconnect", "-f", self.external, name, check=False)
        external = self._attach_external(name)
        docker("start", name)
        return Addresses(network_ip=self._internal.get(name), nat_ip=external)

    def on_stop(self, instance: dict[str, Any]) -> None:
        docker("stop", "-t", "2", self.container(instance), check=False)

    def on_delete(self, instance: dict[str, Any]) -> None:
        name = self.container(instance)
        docker("rm", "-f", "-v", name, check=False)
        self._internal.pop(name, None)

    def on_metadata(self, instance: dict[str, Any]) -> None:
        self._write_keys(instance)
        name = self.container(instance)
        # A running guest picks new keys up at once (the entrypoint installs
        # them again at each start).
        install = (
            f"cat /run/tfcluster/authorized_keys > ~{self.user}/.ssh/authorized_keys"
        )
        if self.running(instance["name"]):
            docker("exec", name, "sh", "-c", install)

    def host_keys(self, instance: dict[str, Any]) -> list[str]:
        # What the guest agent publishes: the container's real host keys,
        # so that the e2e path pins exactly what its sshd presents. Only
        # once they all exist, as the agent publishes after generating
        # them: the entrypoint runs `ssh-keygen -A`, then execs sshd (or
        # the test's command), so a PID 1 that is no longer the entrypoint
        # means the set is whole (read earlier, it could lack a key still
        # being written, and `up` would pin that part).
        if not self.running(instance["name"]):
            return []
        out = docker(
            "exec", self.container(instance), "sh", "-c",
            f'test "$(cat /proc/1/comm)" != {ENTRYPOINT} && cat /etc/ssh/ssh_host_*_key.pub',
            check=False,
        )  # fmt: skip
        return [" ".join(line.split()[:2]) for line in out.splitlines() if line.strip()]

    def watch(self, guest_stopped: Callable[[str], object]) -> None:
        """A container that ends by itself (its guest ran `shutdown`, which
        in a container ends PID 1) is a guest shutdown: followed with
        `docker events`. A stop of the fake's own (stop, preemption,
        delete) has already left the instance not RUNNING, and a container
        that runs again by the time its event is read is no shutdown."""
        self._events = subprocess.Popen(
            ["docker", "events", "--filter", f"label={self.label}", "--filter", "type=container",
             "--filter", "event=die", "--format", "{{.Actor.Attributes.name}}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        events = self._events

        def follow() -> None:
            assert events.stdout is not None
            for line in events.stdout:
                container = line.strip()
                if not container.startswith(f"{self.prefix}-"):
                    continue  # another world's container
                instance = container[len(self.prefix) + 1 :]
                if not self.running(instance):
                    guest_stopped(instance)

        threading.Thread(target=follow, daemon=True, name=f"{self.prefix}-events").start()

    def close(self) -> None:
        if self._events is not None:
            self._events.terminate()
            self._events.wait(timeout=10)
        for kind in ("container", "network"):
            found = docker(kind, "ls", "-aq" if kind == "container" else "-q",
                           "-f", f"label={self.label}", check=False).split()  # fmt: skip
            if found:
                docker(kind, "rm", *(["-f", "-v"] if kind == "container" else []), *found,
                       check=False)  # fmt: skip

    # -- for tests ----------------------------------------------------------------------

    def running(self, instance: str) -> bool:
        state = docker(
            "inspect", "-f", "{{.State.Running}}", self.container(instance), check=False
        )
        return state == "true"

    def containers(self) -> list[str]:
        """Names of this backend's containers, running or not."""
        out = docker("ps", "-a", "-f", f"label={self.label}", "--format", "{{.Names}}")
        return sorted(out.split())

    def networks(self) -> list[str]:
        out = docker("network", "ls", "-f", f"label={self.label}", "--format", "{{.Name}}")
        return sorted(out.split())
