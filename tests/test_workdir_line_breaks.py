"""The working folder's sync speaks one path per line (the hash manifest
``sha256sum -c`` reads, ``find``'s listing, the parsers of both): a file
whose name holds a line break cannot travel that way. Before, it was
silently never sent, and made every later sync compare again; now it is
left out with a warning, on both sides alike."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from infra.setup.sync import local_listing, local_manifest, manifest_text
from infra.setup.sync_items import workdir_item

BREAKS = ["new\nline.txt", "carriage\rreturn.txt", "form\x0cfeed.txt", "para\u2029sep.txt"]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    (work / "a b\\c.txt").write_text("spaces and a backslash travel fine\n")
    for name in BREAKS:
        (work / name).write_text("x\n")
    (work / "dir\nname").mkdir()
    (work / "dir\nname" / "inside.txt").write_text("x\n")
    return work


def test_a_line_break_in_a_name_is_left_out_loudly(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    item = workdir_item(folder, "tfcluster/work")
    with caplog.at_level(logging.WARNING, logger="tfcluster"):
        manifest = local_manifest([item])
    warned = [r.getMessage() for r in caplog.records if "line break" in r.getMessage()]
    assert sorted(manifest) == ["tfcluster/work/a b\\c.txt", "tfcluster/work/train.py"]
    # One manifest line per file: sha256sum -c reads each as HASH  PATH.
    text = manifest_text(manifest)
    assert len(text.splitlines()) == len(manifest)
    # The quick check's listing agrees with the manifest, so a second sync
    # is not forced to compare again by a file that never arrives.
    assert sorted(local_listing([item])) == sorted(manifest)
    assert len(warned) == len(BREAKS) + 1, warned
    assert "'new\\nline.txt'" in " ".join(warned)


def test_a_node_file_with_a_line_break_is_not_deleted_as_stale(folder: Path) -> None:
    """The same rule on the node's side: such a file is not the sync's."""
    item = workdir_item(folder, "tfcluster/work")
    assert not item.keeps("tfcluster/work/out\nput.txt")
    assert item.keeps("tfcluster/work/output.txt")
