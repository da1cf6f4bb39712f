"""The debug log of an unexpected failure: private to the user."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

import deploy
from tfcluster_cli.errors import EXIT_BUG


def _crash(monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    def boom() -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(deploy, "default_config", boom)
    result = CliRunner().invoke(deploy.cli, ["status"], catch_exceptions=False)
    return result.exit_code, result.output


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_debug_log_is_0600_in_a_0700_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "state"
    monkeypatch.setenv("TFCLUSTER_HOME", str(home))
    umask = os.umask(0o022)  # the usual one, under which the old code made 0755 / 0644
    try:
        code, out = _crash(monkeypatch)
    finally:
        os.umask(umask)
    assert code == 70 and "unexpected failure" in out  # EX_SOFTWARE, as the README says
    log = home / "debug.log"
    assert "RuntimeError: a bug" in log.read_text()
    assert _mode(home) == 0o700
    assert _mode(log) == 0o600


def test_an_old_world_readable_debug_log_is_tightened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "state"
    home.mkdir(mode=0o700)
    log = home / "debug.log"
    log.write_text("old\n")
    log.chmod(0o644)
    monkeypatch.setenv("TFCLUSTER_HOME", str(home))
    code, _ = _crash(monkeypatch)
    assert code == EXIT_BUG
    assert _mode(log) == 0o600
    assert log.read_text().startswith("old\n")


def test_a_home_where_no_log_can_be_written_still_gives_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TFCLUSTER_HOME under a regular file: the bug's line without a log,
    never the traceback of writing the log."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TFCLUSTER_HOME", str(blocker / "home"))
    code, out = _crash(monkeypatch)
    assert code == EXIT_BUG
    lines = out.strip().splitlines()
    assert len(lines) == 1 and "unexpected failure" in lines[0], out
    assert "RuntimeError: a bug" in lines[0] and str(blocker) in lines[0], out
