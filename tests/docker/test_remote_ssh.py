"""SshTransport against real sshd nodes (throwaway containers of the node
image): host-key pinning, commands, streaming, fetch, waiting for boot."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from infra.errors import HostKeyChanged, RemoteError
from infra.state.folder import ClusterState
from infra.transport.host_keys import forget_host, known_hosts_name
from infra.transport.ssh import SshTarget
from tests.docker.conftest import StartNode, ssh_config, transport_for, write_config
from tests.ports import free_port

pytestmark = pytest.mark.docker


def _one_node(tmp_path: Path, key: Path, port: int):
    config = write_config(
        tmp_path, ssh_config("t", {"pc-1": {"address": "127.0.0.1", "port": port}}, key)
    )
    return config


def test_host_key_pinned_on_first_contact_and_changed_key_refused(
    tmp_path: Path, bare_image: str, start_node: StartNode, node_key: tuple[Path, str]
) -> None:
    key = node_key[0]
    node = start_node(bare_image)
    config = _one_node(tmp_path, key, node.port)
    home = tmp_path / "home"
    known = ClusterState("t", home=home).known_hosts
    with transport_for(config, key, [node.target()], home) as transport:
        transport.wait_ready(timeout=30)
        assert transport.run("pc-1", "whoami").stdout.strip() == "tfcluster"
    # Recorded: the node's own ed25519 key, as its sshd generated it at first start.
    served = node.exec("cat", "/etc/ssh/ssh_host_ed25519_key.pub").split()[:2]
    name = known_hosts_name("127.0.0.1", node.port)
    assert known.read_text().split() == [name, *served, "pc-1"]

    # Same node again: accepted, nothing new recorded.
    with transport_for(config, key, [node.target()], home) as transport:
        assert transport.run("pc-1", "true").ok
    assert len(known.read_text().splitlines()) == 1

    # The machine is re-created on the same address: new host keys -> refused.
    node.remove()
    again = start_node(bare_image, port=node.port)
    with transport_for(config, key, [again.target()], home) as transport:
        with pytest.raises(HostKeyChanged) as caught:
            transport.wait_ready(timeout=30)
        assert "pc-1" in str(caught.value) and name in str(caught.value)
        assert str(known) in (caught.value.hint or "")
        with pytest.raises(HostKeyChanged):
            transport.run("pc-1", "true")
    # The system ssh (rsync's transport, `deploy.py ssh`) refuses it too.
    with transport_for(config, key, [again.target()], home) as transport:
        import subprocess

        done = subprocess.run(
            [*transport.ssh_argv("pc-1"), "127.0.0.1", "true"], capture_output=True, text=True
        )
        assert done.returncode != 0 and "HOST IDENTIFICATION HAS CHANGED" in done.stderr.upper()

    # The documented fix: forget the old key, and the next contact pins the new one.
    assert forget_host(known, "127.0.0.1", again.port)
    with transport_for(config, key, [again.target()], home) as transport:
        transport.wait_ready(timeout=30)
        assert transport.run("pc-1", "true").ok
    new = again.exec("cat", "/etc/ssh/ssh_host_ed25519_key.pub").split()[1]
    assert new in known.read_text() and served[1] not in known.read_text()


def test_auth_failure_is_named(
    tmp_path: Path, bare_image: str, start_node: StartNode, node_key: tuple[Path, str]
) -> None:
    from infra.state.keys import ensure_key_pair

    other = tmp_path / "other_key"
    node = start_node(bare_image, authorized=ensure_key_pair(other, "someone-else"))
    config = _one_node(tmp_path, node_key[0], node.port)
    with transport_for(config, node_key[0], [node.target()], tmp_path / "home") as transport:
        # sshd may not listen yet: wait until it answers, then it refuses the key.
        deadline = time.monotonic() + 30
        error: RemoteError | None = None
        while time.monotonic() < deadline:
            try:
                transport.run("pc-1", "true")
            except RemoteError as exc:
                error = exc
                if "authentication failed" in str(exc):
                    break
            time.sleep(0.3)
        assert error is not None
        assert "pc-1: authentication failed for tfcluster@127.0.0.1" in str(error)
        assert "authorized_keys" in (error.hint or "")


def test_run_stream_fetch(
    tmp_path: Path, bare_image: str, start_node: StartNode, node_key: tuple[Path, str]
) -> None:
    key = node_key[0]
    node = start_node(bare_image)
    config = _one_node(tmp_path, key, node.port)
    with transport_for(config, key, [node.target()], tmp_path / "home") as transport:
        transport.wait_ready(timeout=30)
        # bash whatever the login shell; a non-zero exit is a result.
        result = transport.run("pc-1", "echo $BASH_VERSION; echo oops >&2; exit 3")
        assert result.exit_code == 3 and result.stdout.strip() and result.stderr == "oops\n"
        assert transport.run("pc-1", "pwd").stdout.strip() == "/home/tfcluster"
        with pytest.raises(RemoteError, match="timed out"):
            transport.run("pc-1", "sleep 5", timeout=0.5)

        # Lines arrive as they are printed, not when the command ends.
        seen: list[tuple[float, str]] = []
        started = time.monotonic()
        code = transport.stream(
            "pc-1",
            "for i in 1 2 3; do echo line $i; sleep 0.4; done; echo err >&2; exit 4",
            lambda line: seen.append((time.monotonic() - started, line)),
        )
        assert code == 4
        assert [line for _, line in seen] == ["line 1", "line 2", "line 3"]
        assert seen[0][0] < seen[2][0] - 0.5

        # tail -F style: follow a file another command appends to.
        transport.run("pc-1", "mkdir -p logs; : > logs/t.log")
        writer = threading.Thread(
            target=lambda: transport.run(
                "pc-1", "for i in 1 2 3; do echo step $i >> logs/t.log; sleep 0.2; done"
            )
        )
        lines: list[str] = []
        writer.start()
        transport.stream(
            "pc-1",
            "timeout 3 tail -n +1 -F logs/t.log | sed -u '/step 3/q'",
            lines.append,
        )
        writer.join()
        assert lines == ["step 1", "step 2", "step 3"]

        # Runs in parallel: four one-second sleeps take about one second.
        started = time.monotonic()
        results = transport.run_all({"pc-1": "sleep 1; echo a"})
        assert results["pc-1"].stdout == "a\n"

        # fetch: a folder tree home, and again only what changed.
        transport.run(
            "pc-1",
            "mkdir -p tfcluster/runs/r1/ckpt && echo 1 > tfcluster/runs/r1/summary.json "
            "&& head -c 100000 /dev/urandom > tfcluster/runs/r1/ckpt/model.bin",
        )
        dest = tmp_path / "fetched"
        for use_rsync in (True, False):
            target = dest / str(use_rsync)
            transport._rsync["pc-1"] = use_rsync
            transport.fetch("pc-1", "tfcluster/runs/r1", target)
            assert (target / "summary.json").read_text() == "1\n"
            assert (target / "ckpt" / "model.bin").stat().st_size == 100000
        with pytest.raises(RemoteError, match="does not exist"):
            transport.fetch("pc-1", "tfcluster/runs/nope", dest / "x")


def test_wait_ready_waits_for_a_booting_node(
    tmp_path: Path, bare_image: str, start_node: StartNode, node_key: tuple[Path, str]
) -> None:
    key = node_key[0]
    port = free_port()
    config = _one_node(tmp_path, key, port)
    boot = threading.Timer(2.0, lambda: start_node(bare_image, port=port))
    boot.start()
    try:
        with transport_for(
            config, key, [SshTarget("pc-1", "127.0.0.1", port)], tmp_path / "home"
        ) as transport:
            started = time.monotonic()
            transport.wait_ready(timeout=60)
            assert time.monotonic() - started >= 1.5
            assert transport.run("pc-1", "true").ok
    finally:
        boot.join()


def test_lost_connection_is_a_remote_error(
    tmp_path: Path, bare_image: str, start_node: StartNode, node_key: tuple[Path, str]
) -> None:
    key = node_key[0]
    node = start_node(bare_image)
    config = _one_node(tmp_path, key, node.port)
    with transport_for(config, key, [node.target()], tmp_path / "home") as transport:
        transport.wait_ready(timeout=30)
        killer = threading.Timer(1.0, node.remove)
        killer.start()
        with pytest.raises(RemoteError):
            transport.stream("pc-1", "while true; do echo tick; sleep 0.2; done", lambda _: None)
        killer.join()


def test_write_private_is_the_logins_alone_and_whole(
    tmp_path: Path, bare_image: str, start_node: StartNode, node_key: tuple[Path, str]
) -> None:
    """The file of a job's environment values (infra/node/task_env.py) over SFTP:
    0600 in a 0700 folder (one that was there, open to all, is closed),
    renamed into place (no temporary file left), written again whole."""
    key = node_key[0]
    node = start_node(bare_image)
    config = _one_node(tmp_path, key, node.port)
    with transport_for(config, key, [node.target()], tmp_path / "home") as transport:
        transport.wait_ready(timeout=30)
        transport.run("pc-1", "mkdir -p tfcluster/env && chmod 755 tfcluster/env")
        transport.write_private("pc-1", "tfcluster/env/r1.env", b"A=1\0B=x y\n\0")
        transport.write_private("pc-1", "tfcluster/env/r1.env", b"A=2\0")
        listing = transport.run(
            "pc-1", "stat -c '%a %n' tfcluster/env tfcluster/env/*; od -c tfcluster/env/r1.env"
        ).stdout
    assert "700 tfcluster/env\n600 tfcluster/env/r1.env\n" in listing, listing
    assert "A   =   2  \\0" in listing, listing
    assert listing.count("tfcluster/env/") == 1, listing  # no temporary file left
