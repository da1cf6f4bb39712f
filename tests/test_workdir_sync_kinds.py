"""The working folder's hash-manifest sync against a real SSH server (the
paramiko node of tests/hostile_node.py, running the sync's commands in a
folder here) when a path changes kind.

Before, the archive was unpacked before the stale files were deleted: a
file that became a folder here (``data`` -> ``data/x.txt``) made tar fail
on the old file, and every later sync failed the same way until the node
was fixed by hand (seen on the compose cluster); a folder that became a
file failed alike, and deleted files left their empty folders behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.setup.sync import _manifest_sync, emptied_dirs
from infra.setup.sync_items import workdir_item
from infra.transport.ssh import SshTransport
from tests.sync_node import sync_node

REMOTE = "tfcluster/work"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[SshTransport, Path]]:
    """A transport to a node whose home is tmp_path/node."""
    with sync_node(tmp_path) as (transport, home):
        (home / REMOTE).mkdir(parents=True)  # the probe makes it before a sync
        yield transport, home / REMOTE


def _sync(transport: SshTransport, local: Path) -> None:
    _manifest_sync(transport, "pc-1", [workdir_item(local, REMOTE)])


def _tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): ("dir" if p.is_dir() else p.read_text())
        for p in sorted(root.rglob("*"))
    }


def test_paths_that_change_kind_and_emptied_folders(
    node: tuple[SshTransport, Path], tmp_path: Path
) -> None:
    transport, remote = node
    local = tmp_path / "work"
    local.mkdir()
    (local / "data").write_text("a file\n")
    (local / "pkg" / "deep").mkdir(parents=True)
    (local / "pkg" / "deep" / "m.py").write_text("x = 1\n")
    _sync(transport, local)
    assert _tree(remote) == {
        "data": "a file\n", "pkg": "dir", "pkg/deep": "dir", "pkg/deep/m.py": "x = 1\n",
    }  # fmt: skip

    # A file becomes a folder; a package is renamed (its old folders go).
    (local / "data").unlink()
    (local / "data").mkdir()
    (local / "data" / "x.txt").write_text("inside\n")
    (local / "pkg").rename(local / "nets")
    _sync(transport, local)
    assert _tree(remote) == {
        "data": "dir", "data/x.txt": "inside\n",
        "nets": "dir", "nets/deep": "dir", "nets/deep/m.py": "x = 1\n",
    }  # fmt: skip

    # And back: the folder becomes a file again. A folder that still holds
    # a node's own ignored file stays (with that file).
    (local / "data" / "x.txt").unlink()
    (local / "data").rmdir()
    (local / "data").write_text("a file again\n")
    (remote / "nets" / "deep" / "__pycache__").mkdir()
    (remote / "nets" / "deep" / "__pycache__" / "m.cpython-311.pyc").write_text("c")
    (local / "nets" / "deep" / "m.py").unlink()
    _sync(transport, local)
    assert _tree(remote) == {
        "data": "a file again\n",
        "nets": "dir", "nets/deep": "dir", "nets/deep/__pycache__": "dir",
        "nets/deep/__pycache__/m.cpython-311.pyc": "c",
    }  # fmt: skip

    # Everything deleted: the working folder itself stays.
    (local / "data").unlink()
    _sync(transport, local)
    assert remote.is_dir()
    assert "data" not in _tree(remote)


def test_emptied_dirs_stay_below_their_item(tmp_path: Path) -> None:
    items = [workdir_item(tmp_path, REMOTE)]
    stale = [f"{REMOTE}/a/b/c.txt", f"{REMOTE}/a/d.txt", f"{REMOTE}/top.txt", "elsewhere/x/y"]
    assert emptied_dirs(stale, items) == [f"{REMOTE}/a/b", f"{REMOTE}/a"]
