"""The Transport interface declares what callers use: local nodes answer
with defaults (no probing with getattr, no downcast to SshTransport)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.config.loader import parse_config
from infra.errors import RemoteError, StateError
from infra.providers.local import LocalTransport
from infra.setup.nodes import setup_nodes


def local(tmp_path: Path) -> LocalTransport:
    (tmp_path / "homes" / "pc-1").mkdir(parents=True)
    return LocalTransport(["pc-1"], tmp_path / "homes")


def test_local_nodes_are_ready_and_have_no_login(tmp_path: Path) -> None:
    transport = local(tmp_path)
    transport.wait_ready()
    transport.wait_ready(timeout=1, nodes=["pc-1"])
    assert transport.interactive("pc-1") is None
    assert not transport.has_rsync("pc-1")
    transport.note_rsync("pc-1", True)  # nothing to remember
    assert not transport.has_rsync("pc-1")


def test_local_nodes_refuse_file_copies(tmp_path: Path) -> None:
    transport = local(tmp_path)
    with pytest.raises(RemoteError, match="pc-1: LocalTransport nodes share"):
        transport.upload("pc-1", b"x", "f")
    with pytest.raises(RemoteError, match="no rsync remote"):
        transport.rsync("pc-1", ["-a"])


def test_setup_refuses_nodes_that_run_this_checkout(tmp_path: Path) -> None:
    config = parse_config({"name": "x"}, source=str(tmp_path / "c.yaml"))
    with pytest.raises(StateError, match="install and sync need SSH nodes; LocalTransport"):
        setup_nodes(local(tmp_path), config)


def test_run_all_names_every_unreachable_node(tmp_path: Path) -> None:
    transport = LocalTransport(["pc-1", "pc-2", "pc-3"], tmp_path / "homes")
    (tmp_path / "homes" / "pc-2").mkdir(parents=True)
    with pytest.raises(RemoteError) as caught:
        transport.run_all({n: "true" for n in transport.nodes})
    message = str(caught.value)
    assert message.startswith("pc-1: ") and "; pc-3: " in message and "pc-2" not in message
    assert transport.run_all({"pc-2": "echo hi"})["pc-2"].stdout == "hi\n"
