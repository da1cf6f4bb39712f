"""SshTransport without a node: error messages, host-key pinning policy,
the commands it hands to the system ssh and rsync."""

from __future__ import annotations

import errno
import socket
import threading
from pathlib import Path

import paramiko
import pytest
from paramiko.ssh_exception import AuthenticationException, NoValidConnectionsError

from infra.config.loader import parse_config
from infra.errors import HostKeyChanged, RemoteError
from infra.state.folder import ClusterState
from infra.transport.host_keys import PinningPolicy, forget_host, known_hosts_name
from infra.transport.ssh import SshTarget, SshTransport, combine_errors
from infra.transport.ssh_connections import connect_error
from tests.ports import free_port

TARGET = SshTarget("pc-2", "10.0.0.7", 2202)
KEY = Path("/keys/id_ed25519")


def _config(**ssh: object):
    return parse_config(
        {
            "name": "t",
            "provider": "ssh",
            "nodes": ["pc-1", "pc-2"],
            "roles": {"ps": "pc-1", "chief": "pc-1", "worker": "pc-2"},
            "hosts": {"pc-1": "127.0.0.1:2201", "pc-2": "127.0.0.1:2202"},
            "ssh": ssh,
        },
        source="test",
    )


def _error(exc: BaseException) -> RemoteError:
    return connect_error(TARGET, "tfcluster", KEY, 10.0, exc)


def test_auth_failure_names_node_key_and_fix() -> None:
    err = _error(AuthenticationException("Authentication failed."))
    assert str(err).startswith("pc-2: authentication failed for tfcluster@10.0.0.7:2202")
    assert str(KEY) in str(err)
    assert err.hint and "authorized_keys" in err.hint and "ssh.key_file" in err.hint


def test_refused_says_booting_or_port() -> None:
    refused = NoValidConnectionsError(
        {("10.0.0.7", 2202): OSError(errno.ECONNREFUSED, "Connection refused")}
    )
    err = _error(refused)
    assert "pc-2: connection refused at 10.0.0.7:2202" in str(err)
    assert err.hint and "booting" in err.hint and "hosts.pc-2.port" in err.hint


def test_unknown_host_and_timeout() -> None:
    err = _error(socket.gaierror(-2, "Name or service not known"))
    assert "unknown host '10.0.0.7'" in str(err) and "hosts.pc-2.address" in (err.hint or "")
    err = _error(TimeoutError("timed out"))
    assert "timed out after 10 s" in str(err) and "firewall" in (err.hint or "")


def test_handshake_failure() -> None:
    err = _error(paramiko.SSHException("Error reading SSH protocol banner"))
    assert "SSH handshake" in str(err) and "banner" in str(err)


def test_combine_prefers_host_key_changed() -> None:
    errors = {"pc-1": RemoteError("pc-1: refused"), "pc-2": HostKeyChanged("pc-2: changed")}
    assert isinstance(combine_errors(errors), HostKeyChanged)
    both = combine_errors({"pc-1": RemoteError("pc-1: a"), "pc-3": RemoteError("pc-3: b")})
    assert str(both) == "pc-1: a; pc-3: b"


def test_known_hosts_name() -> None:
    assert known_hosts_name("10.0.0.7", 22) == "10.0.0.7"
    assert known_hosts_name("127.0.0.1", 22201) == "[127.0.0.1]:22201"


class _Client:
    def __init__(self) -> None:
        self.keys = paramiko.HostKeys()

    def get_host_keys(self) -> paramiko.HostKeys:
        return self.keys


def test_pinning_policy_records_then_refuses(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    # paramiko generates no ed25519 keys; any key type exercises the policy.
    first = paramiko.ECDSAKey.generate()
    other = paramiko.ECDSAKey.generate()
    policy = PinningPolicy(known, "pc-1")
    policy.missing_host_key(_Client(), "[127.0.0.1]:2201", first)  # type: ignore[arg-type]
    line = known.read_text()
    assert line.startswith(f"[127.0.0.1]:2201 {first.get_name()} {first.get_base64()} pc-1")
    assert known.stat().st_mode & 0o777 == 0o600
    # The same key again (another thread got there first): accepted, not duplicated.
    policy.missing_host_key(_Client(), "[127.0.0.1]:2201", first)  # type: ignore[arg-type]
    assert known.read_text() == line
    with pytest.raises(HostKeyChanged) as caught:
        policy.missing_host_key(_Client(), "[127.0.0.1]:2201", other)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "pc-1" in message and "[127.0.0.1]:2201" in message
    assert str(known) in (caught.value.hint or "") and "ssh-keygen -R" in (caught.value.hint or "")
    assert caught.value.exit_code == 8
    assert forget_host(known, "127.0.0.1", 2201)
    assert known.read_text() == ""
    assert not forget_host(known, "127.0.0.1", 2201)


def test_pinning_is_thread_safe(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    keys = [paramiko.ECDSAKey.generate() for _ in range(8)]
    threads = [
        threading.Thread(
            target=PinningPolicy(known, f"pc-{i}").missing_host_key,
            args=(_Client(), f"[127.0.0.1]:{2200 + i}", key),
        )
        for i, key in enumerate(keys)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = known.read_text().splitlines()
    assert sorted(lines) == sorted(
        f"[127.0.0.1]:{2200 + i} {k.get_name()} {k.get_base64()} pc-{i}" for i, k in enumerate(keys)
    )


def _transport(tmp_path: Path, port: int, **ssh: object) -> SshTransport:
    key = tmp_path / "id_ed25519"
    if not key.exists():
        from infra.state.keys import ensure_key_pair

        ensure_key_pair(key, "test")
    state = ClusterState("t", home=tmp_path)
    return SshTransport(
        [SshTarget("pc-1", "127.0.0.1", port)], config=_config(**ssh), state=state, key_file=key
    )


def test_run_on_closed_port_is_refused(tmp_path: Path) -> None:
    with _transport(tmp_path, free_port()) as transport, pytest.raises(RemoteError) as caught:
        transport.run("pc-1", "true")
    assert "pc-1: connection refused at 127.0.0.1" in str(caught.value)


def test_wait_ready_names_nodes_that_never_came_up(tmp_path: Path) -> None:
    with _transport(tmp_path, free_port()) as transport, pytest.raises(RemoteError) as caught:
        transport.wait_ready(timeout=1.0)
    assert str(caught.value).startswith("pc-1 did not accept SSH within 1 s")
    assert "connection refused" in str(caught.value)


def test_unknown_host_fails_at_once(tmp_path: Path) -> None:
    state = ClusterState("t", home=tmp_path)
    from infra.state.keys import ensure_key_pair

    ensure_key_pair(tmp_path / "k", "test")
    transport = SshTransport(
        [SshTarget("pc-1", "no-such-host.invalid", 22)],
        config=_config(),
        state=state,
        key_file=tmp_path / "k",
    )
    with pytest.raises(RemoteError) as caught:
        transport.wait_ready(timeout=30)
    assert "unknown host 'no-such-host.invalid'" in str(caught.value)


def test_layout_is_relative_to_home(tmp_path: Path) -> None:
    layout = _transport(tmp_path, 2201).layout("pc-1")
    assert layout.root == "tfcluster"
    assert layout.code == "tfcluster/code"
    assert layout.python == "tfcluster/venv/bin/python"
    assert layout.runs == "tfcluster/runs" and layout.logs == "tfcluster/logs"


def test_system_ssh_uses_cluster_key_and_pins(tmp_path: Path) -> None:
    transport = _transport(tmp_path, 2201)
    argv = transport.ssh_argv("pc-1")
    joined = " ".join(argv)
    assert f"IdentityFile={tmp_path / 'id_ed25519'}" in joined
    assert f"UserKnownHostsFile={transport.state.known_hosts}" in joined
    assert "StrictHostKeyChecking=yes" in joined and "IdentitiesOnly=yes" in joined
    assert "-p 2201" in joined and "-l tfcluster" in joined
    assert (
        transport.rsync_remote("pc-1", "tfcluster/code/") == "tfcluster@127.0.0.1:tfcluster/code/"
    )
