"""What an instance of the fake GCE *is*: the ``InstanceBackend`` plug-in
(the default keeps nothing but the addresses the fake hands out; the docker
backend's instances are containers, ``docker_backend.py``), the
``Addresses`` a backend answers with, and the host key the default
backend's guests publish (``generated_host_key``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Addresses:
    """What a backend says an instance's addresses are; None: the fake picks."""

    network_ip: str | None = None
    nat_ip: str | None = None


class InstanceBackend:
    """What an instance is. Called on the fake's operation threads (never
    with the fake's lock held, so a hook may take seconds, e.g. to start a
    container) with a deep copy of the instance resource as the API shows
    it (``name``, ``zone`` URL, ``labels``, ``metadata.items`` with the
    ``ssh-keys`` a guest agent would install, ``networkInterfaces``...).

    A hook that raises fails the operation with INTERNAL_ERROR and is
    recorded in ``FakeGce.internal_errors``.
    """

    def on_create(self, instance: dict[str, Any]) -> Addresses:
        """The instance is being provisioned; return its addresses."""
        return Addresses()

    def on_start(self, instance: dict[str, Any]) -> Addresses:
        """A stopped instance starts; return its (new) addresses."""
        return Addresses()

    def on_stop(self, instance: dict[str, Any]) -> None:
        """The instance stops (``stop``, or preempted)."""

    def on_delete(self, instance: dict[str, Any]) -> None:
        """The instance is deleted (its boot disk with it)."""

    def on_metadata(self, instance: dict[str, Any]) -> None:
        """``setMetadata`` changed the metadata (new ``ssh-keys``, say)."""

    def host_keys(self, instance: dict[str, Any]) -> list[str]:
        """The public host keys (``<type> <base64>`` lines) the guest agent
        of this running instance publishes; [] while it has none. Default:
        one generated ed25519 key per instance id (``generated_host_key``),
        kept across stop and start as a disk keeps /etc/ssh. Called on the
        HTTP threads, without the fake's lock."""
        return [generated_host_key(instance["id"])[1]]

    def watch(self, guest_stopped: Callable[[str], object]) -> None:
        """Call ``guest_stopped(instance name)`` whenever an instance's
        guest stops by itself (a shutdown inside it); what it returns is
        ignored (``FakeGce.guest_shutdown`` says whether it was RUNNING).
        Default: guests never do."""

    def close(self) -> None:
        """The fake shuts down: release everything still held."""


_GENERATED: dict[str, tuple[str, str]] = {}
_GENERATED_LOCK = threading.Lock()


def generated_host_key(instance_id: str) -> tuple[str, str]:
    """The default backend's host key of an instance: (private key in
    OpenSSH PEM, public ``ssh-ed25519 <base64>`` line), made on first use."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    with _GENERATED_LOCK:
        if instance_id not in _GENERATED:
            key = Ed25519PrivateKey.generate()
            private = key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption(),
            ).decode()
            public = key.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            ).decode()
            _GENERATED[instance_id] = (private, public)
        return _GENERATED[instance_id]
