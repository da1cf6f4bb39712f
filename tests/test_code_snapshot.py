"""The code a job started with (infra/setup/code_snapshot.py), on a real SSH
node running the commands in a folder here (tests/sync_node.py): a launch
records what it synced; a recovery, which restarts the job without
syncing, first checks that every recorded file is still as it was, and
ends in one line when one changed (the working folder edited here and
synced by an `exec` meanwhile) instead of resuming under other code."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.errors import StateError
from infra.setup import code_snapshot
from infra.setup.facts import CodeCheck, parse_code_check
from infra.setup.nodes import setup_nodes, sync_nodes
from tests.sync_node import sync_node

HINT = "`deploy.py train --resume` goes on"


def test_a_recovery_finds_the_code_its_job_started_with_or_says_it_changed(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    (work / "train.py").write_text("print('v1')\n")
    (work / "pkg" / "model.py").write_text("LAYERS = 2\n")
    with sync_node(tmp_path) as (transport, home):
        config = transport.config
        sync_nodes(transport, config, workdir=work)
        code_snapshot.record(transport, config, "run-1", work)
        code_snapshot.check(transport, "run-1", hint=HINT)  # as it was
        # What the job wrote does not count: files added, caches.
        (home / "tfcluster" / "work" / "out.txt").write_text("results\n")
        (home / "tfcluster" / "work" / "__pycache__").mkdir()
        (home / "tfcluster" / "work" / "__pycache__" / "t.pyc").write_text("c")
        code_snapshot.check(transport, "run-1", hint=HINT)

        # Edited here and synced (an `exec` meanwhile): refused, one line.
        (work / "pkg" / "model.py").write_text("LAYERS = 3  # not the checkpoint's\n")
        sync_nodes(transport, config, workdir=work)
        with pytest.raises(StateError) as info:
            code_snapshot.check(transport, "run-1", hint=HINT)
        message = str(info.value)
        assert message == (
            "the code on pc-1 changed since run-1 started (tfcluster/work/pkg/model.py); "
            "it is not restarted under other code"
        )
        assert info.value.exit_code == 3 and info.value.hint == HINT
        # No record of that job at all (another job launched since).
        with pytest.raises(StateError, match="pc-1 has no record of the code run-2 started"):
            code_snapshot.check(transport, "run-2", hint=HINT)


def test_a_recovered_node_is_set_up_without_a_sync(tmp_path: Path) -> None:
    """The node started again keeps its files; today's working folder is
    not sent to it (only to it, the others keeping the old code)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('today')\n")
    with sync_node(tmp_path) as (transport, home):
        report = setup_nodes(transport, transport.config, install=False, sync=False, workdir=work)
        assert report.nodes["pc-1"].files == 0
        assert not (home / "tfcluster" / "work" / "train.py").exists()
        assert not (home / "tfcluster" / "code" / "trainer").exists()


def test_code_check_parser_on_recorded_output() -> None:
    recorded = Path(__file__).parent / "recorded"
    assert parse_code_check((recorded / "code-changed.txt").read_text()) == CodeCheck(
        True, 4, ("tfcluster/code/trainer/x.py", "tfcluster/code/trainer/y.py", "tfcluster/work/a b.py")
    )
    assert parse_code_check("@tfcluster code changed 0\n") == CodeCheck(True, 0, ())
    assert parse_code_check("@tfcluster code unknown\n") == CodeCheck(False)
    assert parse_code_check("garbage\n@tfcluster code changed lots\n") == CodeCheck(False)
