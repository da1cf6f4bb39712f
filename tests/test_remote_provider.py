"""SshProvider (provider ssh): existing hosts, probed, never created."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from infra.config import parse_config
from infra.errors import StateError
from infra.providers import get_provider
from infra.providers.base import NodeState
from infra.providers.ssh import SshProvider
from infra.remote import SshTransport
from infra.state import ClusterState


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _provider(tmp_path: Path, hosts: dict[str, object]) -> SshProvider:
    config = parse_config(
        {
            "name": "own",
            "provider": "ssh",
            "nodes": list(hosts),
            "roles": {"ps": "pc-1", "chief": "pc-1", "worker": "pc-2"},
            "hosts": hosts,
            "ssh": {"connect_timeout": 2, "boot_timeout": 1},
        },
        source="test",
    )
    provider = get_provider(config, ClusterState("own", home=tmp_path))
    assert isinstance(provider, SshProvider)
    return provider


def test_nodes_are_the_hosts_probed(tmp_path: Path) -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        up = listening.getsockname()[1]
        down = _free_port()
        provider = _provider(
            tmp_path,
            {
                "pc-1": {"address": "127.0.0.1", "port": up, "internal_address": "10.0.0.1"},
                "pc-2": f"127.0.0.1:{down}",
            },
        )
        nodes = {n.name: n for n in provider.non_terminated_nodes()}
    assert nodes["pc-1"].state is NodeState.RUNNING and nodes["pc-1"].status == "REACHABLE"
    assert nodes["pc-1"].internal_ip == "10.0.0.1"
    assert (nodes["pc-1"].ssh_host, nodes["pc-1"].ssh_port) == ("127.0.0.1", up)
    # Unreachable: PENDING with the reason; its internal address defaults to the address.
    assert nodes["pc-2"].state is NodeState.PENDING and nodes["pc-2"].status == "REFUSED"
    assert nodes["pc-2"].internal_ip == "127.0.0.1"


def test_nothing_to_stop_and_a_down_host_is_an_error(tmp_path: Path) -> None:
    down = _free_port()
    provider = _provider(tmp_path, {"pc-1": f"127.0.0.1:{down}", "pc-2": f"127.0.0.1:{down}"})
    assert not provider.can_stop()
    with pytest.raises(StateError, match="not ours to stop"):
        provider.stop_nodes(["pc-1"])
    with pytest.raises(Exception, match=r"pc-1 \(REFUSED\)"):
        provider.create_nodes(["pc-1"])
    # down on hosts that do not answer: nothing to stop, nothing deleted, no error.
    provider.terminate_nodes(["pc-1", "pc-2"])


def test_transport_uses_the_cluster_key(tmp_path: Path) -> None:
    provider = _provider(tmp_path, {"pc-1": "127.0.0.1:2201", "pc-2": "127.0.0.1:2202"})
    provider.prepare()
    assert provider.state.key_file.exists()
    nodes = provider.non_terminated_nodes()
    transport = provider.transport(nodes)
    assert isinstance(transport, SshTransport)
    assert transport.key_file == provider.state.key_file
    assert transport.target("pc-2").port == 2202
