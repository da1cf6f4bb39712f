"""infra.setup.nodes against real nodes: install idempotency (the marker) and
incremental sync (rsync, and the manifest fallback)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from infra.setup.nodes import install_plan, setup_nodes, sync_nodes
from infra.setup.sync_items import CODE_PATHS, PROJECT_ROOT
from tests.docker.conftest import StartNode, ssh_config, transport_for, write_config

pytestmark = pytest.mark.docker


@pytest.fixture
def tiny_wheelhouse(tmp_path: Path, wheelhouse: Path) -> Path:
    """One small pure wheel out of the real wheelhouse: installs in a second."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    for wheel in wheelhouse.glob("six-*.whl"):
        shutil.copy(wheel, folder)
    assert list(folder.iterdir()), "the wheelhouse has no six wheel"
    return folder


def test_install_once_then_nothing(
    tmp_path: Path,
    bare_image: str,
    start_node: StartNode,
    node_key: tuple[Path, str],
    tiny_wheelhouse: Path,
) -> None:
    key = node_key[0]
    (tmp_path / "requirements.txt").write_text("six==1.17.0\n")
    nodes = [start_node(bare_image), start_node(bare_image)]
    hosts = {f"pc-{i}": {"address": "127.0.0.1", "port": n.port} for i, n in enumerate(nodes, 1)}
    setup = {
        "requirements": "requirements.txt",
        "wheelhouse": str(tiny_wheelhouse),
        "commands": ["echo ran >> ~/commands.log"],
    }
    config = write_config(tmp_path, ssh_config("t", hosts, key, setup=setup))
    targets = [n.target(f"pc-{i}") for i, n in enumerate(nodes, 1)]
    events: list[tuple[str, str]] = []
    with transport_for(config, key, targets, tmp_path / "home") as transport:
        transport.wait_ready(timeout=30)
        first = setup_nodes(transport, config, on_event=lambda n, w: events.append((n, w)))
        assert {n.install for n in first.nodes.values()} == {"installed"}
        assert first.changed and not first.failed
        assert {n for n, _ in events} == {"pc-1", "pc-2"}
        for node in ("pc-1", "pc-2"):
            check = transport.run(
                node,
                "tfcluster/venv/bin/python -c 'import six; print(six.__version__)'; "
                "cat tfcluster/venv/.tfcluster-install; cat ~/commands.log; "
                "ls tfcluster/wheelhouse",
            )
            assert check.stdout.split() == [
                "1.17.0",
                install_plan(config).fingerprint,
                "ran",
                *sorted(p.name for p in tiny_wheelhouse.iterdir()),
            ]

        second = setup_nodes(transport, config)
        assert {n.install for n in second.nodes.values()} == {"already installed"}
        assert not second.changed
        assert all(line.endswith("already installed, code up to date") for line in second.lines())
        # The commands did not run again.
        assert transport.run("pc-1", "cat ~/commands.log").stdout == "ran\n"

    # Anything in the fingerprint changes -> installed again.
    setup["commands"] = ["echo ran >> ~/commands.log", "true"]
    changed = write_config(tmp_path, ssh_config("t", hosts, key, setup=setup))
    with transport_for(changed, key, targets, tmp_path / "home") as transport:
        third = setup_nodes(transport, changed)
        assert {n.install for n in third.nodes.values()} == {"installed"}
        assert transport.run("pc-1", "cat ~/commands.log").stdout == "ran\nran\n"


def test_failed_install_is_reported_per_node(
    tmp_path: Path,
    bare_image: str,
    start_node: StartNode,
    node_key: tuple[Path, str],
    tiny_wheelhouse: Path,
) -> None:
    key = node_key[0]
    (tmp_path / "requirements.txt").write_text("six==1.17.0\n")
    node = start_node(bare_image)
    setup = {
        "requirements": "requirements.txt",
        "wheelhouse": str(tiny_wheelhouse),
        "commands": ["exit 7"],
    }
    hosts = {"pc-1": {"address": "127.0.0.1", "port": node.port}}
    config = write_config(tmp_path, ssh_config("t", hosts, key, setup=setup))
    with transport_for(config, key, [node.target()], tmp_path / "home") as transport:
        transport.wait_ready(timeout=30)
        report = setup_nodes(transport, config, check=False)
        assert report.failed["pc-1"].error is not None
        assert "setup.commands[0] failed" in (report.failed["pc-1"].error or "")
        # No marker: the next up tries again.
        assert transport.run("pc-1", "test -e tfcluster/venv/.tfcluster-install").exit_code == 1
        from infra.errors import RemoteError

        with pytest.raises(RemoteError, match=r"setup failed: pc-1: install failed"):
            setup_nodes(transport, config)


@pytest.mark.parametrize("method", ["rsync", "manifest"])
def test_sync_sends_only_changes(
    tmp_path: Path,
    bare_image: str,
    start_node: StartNode,
    node_key: tuple[Path, str],
    method: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if method == "manifest":
        # As on a machine without rsync: hashes compared on the node, a tar of changes.
        monkeypatch.setattr(
            "infra.transport.ssh.SshTransport.has_local_rsync", staticmethod(lambda: False)
        )
    key = node_key[0]
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    for i in range(5):
        (data / f"part-{i}.bin").write_bytes(bytes([i]) * 1000)
    (data / "sub" / "notes.txt").write_text("hello\n")
    node = start_node(bare_image)
    hosts = {"pc-1": {"address": "127.0.0.1", "port": node.port}}
    config = write_config(tmp_path, ssh_config("t", hosts, key, setup={"sync": ["data"]}))
    with transport_for(config, key, [node.target()], tmp_path / "home") as transport:
        transport.wait_ready(timeout=30)
        first = sync_nodes(transport, config).nodes["pc-1"]
        assert first.method == method
        # What the checkout sends as code (sync_items.CODE_PATHS): the trainer,
        # the node's uploader, pyproject.toml.
        code_files = 0
        for name in CODE_PATHS:
            root = PROJECT_ROOT / name
            found = [root] if root.is_file() else root.rglob("*")
            code_files += sum(
                1
                for p in found
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
            )
        assert first.files == 6 + code_files
        listing = transport.run("pc-1", "cd tfcluster && find data code -type f | sort").stdout
        assert "data/sub/notes.txt" in listing and "code/trainer/__init__.py" in listing
        # Python's own cache on the node is never touched.
        transport.run(
            "pc-1",
            "mkdir -p tfcluster/code/trainer/__pycache__ && touch "
            "tfcluster/code/trainer/__pycache__/x.cpython-311.pyc",
        )

        again = sync_nodes(transport, config).nodes["pc-1"]
        assert (again.files, again.deleted) == (0, 0)
        assert not again.changed

        (data / "part-3.bin").write_bytes(b"changed")
        (data / "sub" / "notes.txt").unlink()
        third = sync_nodes(transport, config).nodes["pc-1"]
        assert (third.files, third.bytes, third.deleted) == (1, 7, 1)
        got = transport.run(
            "pc-1",
            "cat tfcluster/data/part-3.bin; echo; test -e tfcluster/data/sub/notes.txt || "
            "echo gone; ls tfcluster/code/trainer/__pycache__",
        ).stdout.split()
        assert got == ["changed", "gone", "x.cpython-311.pyc"]
