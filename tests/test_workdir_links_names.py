"""Edges of the working folder's sync, against a real SSH server running
the sync's commands in a folder here (tests/sync_node.py):

- a symlink to a file inside the working folder arrives as that file
  (before: as a link, dangling where it was absolute, and never in the
  node's listing, so every sync compared again); one to anything outside
  is left out with one warning;
- a file name that is not UTF-8 is left out with one warning (before: the
  manifest could not be written, and `run`, `exec` and `sweep` exited 70),
  and a node's own such file is left alone;
- ``setup.sync`` keeps back what the working folder does: ``setup.sync:
  ["."]`` sent ssh.key_file and the service-account key to every node.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from infra.config.loader import parse_config
from infra.errors import ConfigError
from infra.setup.commands import probe_command, rsync_args
from infra.setup.facts import SyncStats, parse_listing
from infra.setup.sync import _manifest_sync, _under, in_sync, local_listing, sync_to_node
from infra.setup.sync_items import sync_items, workdir_item
from infra.transport.base import NodeLayout
from tests.sync_node import NodeTransport, sync_node

REMOTE = "tfcluster/work"
NOT_UTF8 = os.fsdecode(b"caf\xe9.txt")  # latin-1 bytes, as an old archive may hold


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def in_sync_after(transport: NodeTransport, local: Path) -> bool:
    """The quick check a second sync makes: the node's listing (the probe,
    run there) against this machine's."""
    layout = transport.layout("pc-1")
    item = workdir_item(local, REMOTE)
    probe = transport.run("pc-1", probe_command(layout, "x", [item]))
    remote = parse_listing(probe.stdout, layout)
    assert remote is not None
    return in_sync(_under(remote, item), _under(local_listing([item]), item))


def test_links_inside_arrive_as_files_and_links_out_stay_here(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local = tmp_path / "work"
    (local / "data").mkdir(parents=True)
    (local / "data" / "real.txt").write_text("the data\n")
    (local / "rel.txt").symlink_to("data/real.txt")
    (local / "abs.txt").symlink_to(local / "data" / "real.txt")
    (tmp_path / "outside.txt").write_text("not the project's\n")
    (local / "out.txt").symlink_to("../outside.txt")
    (local / "dangling.txt").symlink_to("no-such-file")
    with sync_node(tmp_path) as (transport, home), caplog.at_level(logging.WARNING, "tfcluster"):
        remote = home / REMOTE
        remote.mkdir(parents=True)
        stats = _manifest_sync(transport, "pc-1", [workdir_item(local, REMOTE)])
        assert stats.files == 3
        for name in ("rel.txt", "abs.txt"):
            assert not (remote / name).is_symlink(), name
            assert (remote / name).read_text() == "the data\n"
        assert not os.path.lexists(remote / "out.txt")
        assert not os.path.lexists(remote / "dangling.txt")
        # Nothing left to send: the quick check agrees, and so do the hashes.
        assert in_sync_after(transport, local)
        assert _manifest_sync(transport, "pc-1", [workdir_item(local, REMOTE)]) == SyncStats()
    # One warning each, however often the folder was listed.
    assert warnings_of(caplog) == [
        "not syncing dangling.txt: a symlink to no file",
        "not syncing out.txt: a symlink to outside the working folder",
    ]



def test_a_link_to_a_file_the_folder_keeps_back_is_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A link inside the folder to a file the sync keeps back (a key in a
    .ssh folder, a file .gitignore excludes) sent that file's content
    under the link's name: the key reached every node."""
    local = tmp_path / "work"
    (local / ".ssh").mkdir(parents=True)
    (local / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    (local / "secret").mkdir()
    (local / "secret" / "token.txt").write_text("TOKEN\n")
    (local / ".gitignore").write_text("secret/\n")
    (local / "deploy_key").symlink_to(".ssh/id_ed25519")
    (local / "token.txt").symlink_to("secret/token.txt")
    (local / "main.py").write_text("print(1)\n")
    with sync_node(tmp_path) as (transport, home), caplog.at_level(logging.WARNING, "tfcluster"):
        remote = home / REMOTE
        remote.mkdir(parents=True)
        _manifest_sync(transport, "pc-1", [workdir_item(local, REMOTE)])
        sent = sorted(p.relative_to(remote).as_posix() for p in remote.rglob("*"))
        assert sent == [".gitignore", "main.py"], sent
        assert in_sync_after(transport, local)
    said = warnings_of(caplog)
    for name in ("deploy_key", "token.txt"):
        assert f"not syncing {name}: a symlink to a file that is not synced" in said, said


def test_a_name_that_is_not_utf8_is_left_out_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local = tmp_path / "work"
    local.mkdir()
    (local / "train.py").write_text("print('hi')\n")
    (local / NOT_UTF8).write_text("x\n")
    (local / os.fsdecode(b"dir\xff")).mkdir()
    with sync_node(tmp_path) as (transport, home), caplog.at_level(logging.WARNING, "tfcluster"):
        remote = home / REMOTE
        remote.mkdir(parents=True)
        # The node's program wrote a file of such a name: it is its own.
        (remote / os.fsdecode(b"out\xff.bin")).write_text("node's\n")
        assert _manifest_sync(transport, "pc-1", [workdir_item(local, REMOTE)]).files == 1
        assert sorted(os.listdir(os.fsencode(remote))) == [b"out\xff.bin", b"train.py"]
        assert in_sync_after(transport, local)
    assert sorted(warnings_of(caplog)) == [
        "not syncing 'caf\\udce9.txt': its name is not UTF-8; rename it",
        "not syncing 'dir\\udcff': its name is not UTF-8; rename it",
    ]


LAYOUT = NodeLayout("tfcluster", "tfcluster/code", "p", "tfcluster/runs", "tfcluster/logs")


@pytest.mark.parametrize("method", ["rsync", "manifest"])
def test_setup_sync_keeps_back_the_keys_the_working_folder_does(
    tmp_path: Path, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``setup.sync: ["."]``: the config's folder, which holds the keys."""
    project = tmp_path / "project"
    (project / "keys").mkdir(parents=True)
    (project / "keys" / "id_ed25519").write_text("SECRET")
    (project / "keys" / "id_ed25519.pub").write_text("ssh-ed25519 AAAA public\n")
    (project / "sa.json").write_text('{"private_key": "SECRET"}')
    (project / "data.csv").write_text("1,2\n")
    (project / ".ssh").mkdir()
    (project / ".ssh" / "id_rsa").write_text("SECRET")
    (project / "state" / "clusters" / "t").mkdir(parents=True)
    (project / "state" / "clusters" / "t" / "id_ed25519").write_text("SECRET")
    monkeypatch.setenv("TFCLUSTER_HOME", str(project / "state"))
    sections = {
        "setup": {"sync": ["."]},
        "ssh": {"key_file": "keys/id_ed25519"},
        "gce": {"credentials": "sa.json"},
    }
    with sync_node(tmp_path, project, **sections) as (transport, home):
        (item,) = [i for i in sync_items(transport.config, LAYOUT) if i.local == project]
        sent = sorted(p.relative_to(project).as_posix() for p in item.files())
        assert sent == ["data.csv", "keys/id_ed25519.pub"]
        # Sent once before this was fixed: the next sync deletes it there.
        there = home / "tfcluster" / "project"
        (there / "keys").mkdir(parents=True)
        (there / "keys" / "id_ed25519").write_text("SECRET")
        sync_to_node(transport, "pc-1", [item], rsync=method == "rsync")
        left = sorted(p.relative_to(there).as_posix() for p in there.rglob("*") if p.is_file())
        assert left == ["data.csv", "keys/id_ed25519.pub"], method


def test_setup_sync_of_the_home_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    config = parse_config(
        {"name": "t", "setup": {"sync": ["~"]}}, source="test", base_dir=tmp_path / "p"
    )
    with pytest.raises(ConfigError, match=r"setup.sync: '~' .*everything in it would go"):
        sync_items(config, LAYOUT)


@pytest.mark.skipif(shutil.which("rsync") is None, reason="needs a local rsync")
def test_a_kept_back_name_with_wildcards_hides_that_file_alone(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("key*[1]?", "key-x-1y", "a\\b"):
        (src / name).write_text(name)
    dest = tmp_path / "node"
    dest.mkdir()
    hidden = ["/src/key*[1]?", "/src/a\\b"]
    argv = ["rsync", *rsync_args([src], "", contents=False, hidden=hidden), f"{dest}/"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (dest / "src").iterdir()) == ["key-x-1y"]
