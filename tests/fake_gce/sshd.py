"""A minimal real SSH server on loopback (paramiko), for host-key tests.

``LoopbackSshd(host_key)`` listens on 127.0.0.1 at a free port and speaks
real SSH with ``host_key``: it accepts any public key of ``user`` (what
matters in these tests is which host key the client accepts, not who logs
in) and answers every ``exec`` with exit status 0 and no output. ``stop``
(or leaving the ``with`` block) closes the socket and every session.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import paramiko
from paramiko.common import (  # defined here; paramiko re-exports them, its stubs do not
    AUTH_FAILED,
    AUTH_SUCCESSFUL,
    OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED,
    OPEN_SUCCEEDED,
)

from tests.fake_gce.backend import Addresses, InstanceBackend


class _Server(paramiko.ServerInterface):
    def __init__(self, user: str) -> None:
        self.user = user

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        ok = username == self.user
        return AUTH_SUCCESSFUL if ok else AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return OPEN_SUCCEEDED
        return OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: Any, command: bytes) -> bool:
        def finish() -> None:
            channel.send_exit_status(0)
            channel.close()

        threading.Thread(target=finish, daemon=True).start()
        return True


class LoopbackSshd:
    def __init__(self, host_key: paramiko.PKey, *, user: str = "tfcluster") -> None:
        self.host_key = host_key
        self.user = user
        self.connections = 0
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port: int = self._sock.getsockname()[1]
        self._transports: list[paramiko.Transport] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(self.host_key)
            with self._lock:
                self.connections += 1
                self._transports.append(transport)
            try:
                transport.start_server(server=_Server(self.user))
            except (paramiko.SSHException, EOFError, OSError):
                transport.close()

    def stop(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        with contextlib.suppress(OSError):
            self._sock.close()
        with self._lock:
            transports, self._transports = self._transports, []
        for transport in transports:
            transport.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> LoopbackSshd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LoopbackBackend(InstanceBackend):
    """Fake GCE instances whose external IP is 127.0.0.1 (so ``ssh.port``
    reaches a ``LoopbackSshd``) and whose guest agent publishes
    ``published`` (``<type> <base64>`` lines) as their host keys."""

    def __init__(self, published: list[str] | None = None) -> None:
        self.published = list(published or [])

    def on_create(self, instance: dict[str, Any]) -> Addresses:
        return Addresses(nat_ip="127.0.0.1")

    def on_start(self, instance: dict[str, Any]) -> Addresses:
        return Addresses(nat_ip="127.0.0.1")

    def host_keys(self, instance: dict[str, Any]) -> list[str]:
        return list(self.published)


def key_line(key: paramiko.PKey) -> str:
    """``<type> <base64>``, as a guest agent publishes a host key."""
    return f"{key.get_name()} {key.get_base64()}"
