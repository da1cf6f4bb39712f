"""The system ssh that rsync and `deploy.py ssh` run, against a real SSH
server on loopback (paramiko): its options must survive a state folder
whose path has a space, a '%' or a quote in it."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
from paramiko.common import (  # defined here; paramiko re-exports them, its stubs do not
    AUTH_SUCCESSFUL,
    OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED,
    OPEN_SUCCEEDED,
)

from infra.config.loader import parse_config
from infra.state.folder import ClusterState
from infra.state.keys import ensure_key_pair
from infra.transport.ssh import SshTarget, SshTransport

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client")


class _AcceptAll(paramiko.ServerInterface):
    """Any public key logs in; `exec` of anything exits 0."""

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return AUTH_SUCCESSFUL

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return OPEN_SUCCEEDED
        # Any other channel (a forwarding) is refused, as paramiko's own default.
        return OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        def finish() -> None:
            channel.send_exit_status(0)
            channel.close()

        threading.Timer(0.05, finish).start()
        return True


@pytest.fixture
def sshd() -> Iterator[tuple[int, paramiko.PKey]]:
    """A one-host SSH server on 127.0.0.1: (port, its host key)."""
    host_key = paramiko.ECDSAKey.generate()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    stop = threading.Event()
    sessions: list[paramiko.Transport] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(host_key)
            sessions.append(transport)
            try:
                transport.start_server(server=_AcceptAll())
            except (paramiko.SSHException, EOFError, OSError):
                transport.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], host_key
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
        for transport in sessions:
            transport.close()


@pytest.mark.parametrize("folder", ["my home", "100% sure", 'say "hi"', "back\\slash"])
def test_system_ssh_finds_the_pinned_key_in_an_odd_home(
    tmp_path: Path, sshd: tuple[int, paramiko.PKey], folder: str
) -> None:
    port, host_key = sshd
    home = tmp_path / folder / ".tfcluster"
    state = ClusterState("t", home=home)
    state.ensure_dir()
    key = state.key_file
    ensure_key_pair(key, "test")
    state.known_hosts.write_text(
        f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n"
    )
    config = parse_config(
        {
            "name": "t",
            "provider": "ssh",
            "nodes": ["pc-1"],
            "roles": {"ps": [], "chief": "pc-1", "worker": []},
            "job": {"mode": "single"},
            "hosts": {"pc-1": f"127.0.0.1:{port}"},
            "ssh": {"connect_timeout": 5},
        },
        source="test",
    )
    transport = SshTransport(
        [SshTarget("pc-1", "127.0.0.1", port)], config=config, state=state, key_file=key
    )
    argv = transport.ssh_argv("pc-1")
    done = subprocess.run(
        [*argv, "127.0.0.1", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    # The old, unquoted option read "<tmp>/my" and "home/..." instead, found
    # no pinned key and refused: "Host key verification failed", exit 255.
    assert done.returncode == 0, done.stderr
