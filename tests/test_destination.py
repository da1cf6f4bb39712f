"""infra/jobs/destination.py: a place the results cannot come home to is refused
before a job starts, and told as what it is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra.cluster.api import Cluster
from infra.config.loader import default_config
from infra.errors import ConfigError
from infra.jobs.destination import check_destination


def test_a_link_to_a_file_is_a_file_in_the_way_not_a_broken_link(tmp_path: Path) -> None:
    """A symbolic link to a regular file was called "a broken symbolic
    link": the user looks for a dangling link that is not there."""
    target = tmp_path / "notes.txt"
    target.write_text("")
    link = tmp_path / "results"
    link.symlink_to(target)
    with pytest.raises(ConfigError) as caught:
        check_destination(link / "run-1", link)
    assert "broken" not in str(caught.value)
    assert f"{link} is a file, not a folder" in str(caught.value)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="is a broken symbolic link"):
        check_destination(dangling / "run-1", dangling)


def test_the_default_results_folder_is_checked_before_the_job_as_a_dest_is() -> None:
    """Without --dest the run folder comes home to runs/<cluster>/ of the
    current folder (a tmp folder here). Where that cannot be made (a file
    named runs, a read-only folder), `train` and `run` still ran the whole
    job and only warned at its end, while `sweep` refused at once and
    `--dest` is refused at once: the same check, whatever the folder."""
    Path("runs").write_text("not a folder\n")
    with pytest.raises(ConfigError, match=r"runs is a file, not a folder"):
        Cluster(default_config()).local_run_dir("run-1")
    Path("runs").unlink()
    cluster = Cluster(default_config())
    assert cluster.local_run_dir("run-1") == Path("runs") / cluster.config.name / "run-1"
    assert not [p for p in os.listdir(".") if p.startswith(".tfcluster-dest-")]
