"""A node to sync to, for the sync's tests: the paramiko SSH server of
tests/hostile_node.py running the sync's commands (and rsync's server)
with real sh in a folder here, reached through the real ``SshTransport``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import paramiko

from infra.config.loader import parse_config
from infra.state.folder import ClusterState
from infra.state.keys import ensure_key_pair
from infra.transport.ssh import SshTarget, SshTransport
from tests.hostile_node import fake_node


class NodeTransport(SshTransport):
    """The fake node's SFTP is read-only: uploads land in its home directly
    (what is tested is the commands, which run over SSH for real)."""

    home: Path

    def upload(self, node: str, local: Path | bytes, remote_path: str) -> None:
        target = self.home / remote_path
        target.write_bytes(local if isinstance(local, bytes) else local.read_bytes())


@contextlib.contextmanager
def sync_node(
    tmp_path: Path, base_dir: Path | None = None, **config: object
) -> Iterator[tuple[NodeTransport, Path]]:
    """A transport to node pc-1, whose home is ``tmp_path``/node (both),
    for a cluster.yaml in ``base_dir`` with ``config``'s sections."""
    key = tmp_path / "keys" / "id_ed25519"
    ensure_key_pair(key, "test")
    home = tmp_path / "node"
    home.mkdir(exist_ok=True)
    data: dict[str, object] = {
        "name": "t",
        "provider": "ssh",
        "nodes": ["pc-1"],
        "roles": {"ps": [], "chief": "pc-1", "worker": []},
        "hosts": {"pc-1": "127.0.0.1"},
        "job": {"mode": "single"},
        **config,
    }
    with fake_node(paramiko.PKey.from_path(key), home=home) as fake:
        transport = NodeTransport(
            [SshTarget("pc-1", "127.0.0.1", fake.port)],
            config=parse_config(data, source="test", base_dir=base_dir or tmp_path),
            state=ClusterState("t", home=tmp_path / "state"),
            key_file=key,
        )
        transport.home = home
        with transport:
            yield transport, home
