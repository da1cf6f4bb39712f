"""What a manifest sync sends and deletes, decided in Python from the
local manifest and what the node reported (the commands that carry it out
run for real in test_workdir_sync_kinds.py and the docker tests).

A sync that never deletes leaves a renamed module's old file on the node,
where Python still imports it; one that deletes too much removes a node's
own files (caches, ignored outputs) or files of other items."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from infra.setup.commands import rsync_args
from infra.setup.facts import Comparison, SyncStats, parse_rsync
from infra.setup.sync import local_manifest, sync_decision
from infra.setup.sync_items import SyncItem, workdir_item


def test_send_what_changed_delete_what_is_gone_and_nothing_else(tmp_path: Path) -> None:
    code = tmp_path / "trainer"
    code.mkdir()
    for name in ("a.py", "b.py"):
        (code / name).write_text(f"# {name}\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / ".gitignore").write_text("*.log\n")
    (work / "x.py").write_text("x = 1\n")
    items = [SyncItem(code, "tf/code/trainer"), workdir_item(work, "tf/work")]
    manifest = local_manifest(items)
    assert {"tf/code/trainer/a.py", "tf/code/trainer/b.py", "tf/work/x.py"} <= set(manifest)

    node = Comparison(
        changed={"tf/code/trainer/a.py", "tf/work/x.py"},
        present={
            "tf/code/trainer/a.py", "tf/code/trainer/b.py",  # b.py is up to date
            "tf/code/trainer/old.py",  # renamed here since the last sync
            "tf/work/x.py", "tf/work/gone/y.py",  # deleted here
            "tf/work/train.log",  # ignored here: the node's own output
            "tf/runs/r1/summary.json",  # no item's: never touched
        },
    )  # fmt: skip
    send, stale = sync_decision(manifest, node, items)
    assert send == ["tf/code/trainer/a.py", "tf/work/x.py"]
    assert stale == ["tf/code/trainer/old.py", "tf/work/gone/y.py"]


def test_nothing_differs_nothing_moves(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("m = 1\n")
    items = [SyncItem(tmp_path, "tf/code/pkg")]
    manifest = local_manifest(items)
    assert sync_decision(manifest, Comparison(set(), set(manifest)), items) == ([], [])


@pytest.mark.skipif(shutil.which("rsync") is None, reason="needs a local rsync")
def test_rsync_deletes_what_is_gone_here_and_keeps_the_nodes_caches(tmp_path: Path) -> None:
    """The rsync path (nodes that have rsync) decides the same: the real
    rsync, local to local, with the flags a node sync gets."""
    src = tmp_path / "trainer"
    src.mkdir()
    (src / "a.py").write_text("a = 1\n")
    (src / "old.py").write_text("old = 1\n")
    dest = tmp_path / "node"
    dest.mkdir()

    def sync() -> SyncStats:
        argv = ["rsync", *rsync_args([src], "", contents=False), f"{dest}/"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return parse_rsync(done.stdout)

    assert sync().files == 2
    (src / "old.py").unlink()  # renamed away here
    cache = dest / "trainer" / "__pycache__"
    cache.mkdir()
    (cache / "a.cpython-311.pyc").write_bytes(b"c")  # the node's own
    assert sync().deleted == 1
    assert sorted(p.name for p in (dest / "trainer").iterdir()) == ["__pycache__", "a.py"]
    assert (cache / "a.cpython-311.pyc").exists()
