"""SshProvider (provider ssh): existing hosts, probed, never created."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from deploy import cli
from infra.cluster.api import Cluster
from infra.config.loader import parse_config
from infra.errors import ProviderError, StateError
from infra.providers.base import NodeState, get_provider
from infra.providers.ssh import SshProvider
from infra.state.folder import ClusterState
from infra.transport.ssh import SshTransport
from tests.ports import free_port


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
        down = free_port()
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
    down = free_port()
    provider = _provider(tmp_path, {"pc-1": f"127.0.0.1:{down}", "pc-2": f"127.0.0.1:{down}"})
    assert provider.capabilities().cannot_stop is not None
    with pytest.raises(StateError, match="not ours to stop"):
        provider.stop_nodes(["pc-1"])
    with pytest.raises(ProviderError, match=r"pc-1 at 127\.0\.0\.1:\d+: connection refused"):
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


def _down_hosts_config(tmp_path: Path) -> dict[str, object]:
    down = free_port()
    return {
        "name": "own",
        "provider": "ssh",
        "nodes": ["pc-1", "pc-2"],
        "roles": {"ps": "pc-1", "chief": "pc-1", "worker": "pc-2"},
        "hosts": {"pc-1": f"127.0.0.1:{down}", "pc-2": f"127.0.0.1:{down}"},
        # The cloud's timeout must not apply to existing hosts.
        "gce": {"operation_timeout": 60},
        "ssh": {"connect_timeout": 1, "boot_timeout": 1},
    }


def test_up_waits_boot_timeout_and_says_refused(tmp_path: Path) -> None:
    cluster = Cluster(parse_config(_down_hosts_config(tmp_path), source="test"))
    plan = cluster.plan_up()
    assert plan.wait == ["pc-1", "pc-2"]
    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        cluster.up(plan, setup=False)
    assert time.monotonic() - started < 15  # boot_timeout (1 s) and a probe, not 60 s
    message = str(caught.value)
    assert "after 1 s (ssh.boot_timeout)" in message
    assert "pc-1 at 127.0.0.1:" in message and "connection refused" in message


def test_up_plan_says_why_a_host_is_waited_for(tmp_path: Path) -> None:
    plan = Cluster(parse_config(_down_hosts_config(tmp_path), source="test")).plan_up()
    assert "wait    pc-1 (not answering on its SSH port: refused)" in plan.lines()


def test_train_before_up_says_what_to_do(tmp_path: Path) -> None:
    file = tmp_path / "cluster.yaml"
    file.write_text(yaml.safe_dump(_down_hosts_config(tmp_path)))
    result = CliRunner().invoke(cli, ["--config", str(file), "train"], catch_exceptions=False)
    assert result.exit_code == 3, result.output
    assert "does not answer on its SSH port (refused)" in result.output
    assert "check the hosts, then" not in result.output
    assert "then run `deploy.py up`" in result.output


def test_ipv6_host_is_bracketed_in_task_addresses(tmp_path: Path) -> None:
    provider = _provider(tmp_path, {"pc-1": "[::1]:2201", "pc-2": "127.0.0.1:2202"})
    nodes = {n.name: n for n in provider.non_terminated_nodes()}
    # SSH takes the bare address; TF_CONFIG's host:port needs the brackets.
    assert nodes["pc-1"].ssh_host == "::1" and nodes["pc-1"].ssh_port == 2201
    assert nodes["pc-1"].internal_ip == "[::1]"
