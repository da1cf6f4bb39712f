"""A job's life through the library alone (infra/jobs/run.py), as a notebook
would drive it: no click, no deploy.py. A stand-in program (no TensorFlow)
on the embedded local cluster; afterwards no process of the job is left."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.cluster.api import Cluster
from infra.config.loader import default_config
from infra.errors import ConfigError, JobFailed
from infra.jobs.job import Job
from infra.jobs.progress import ProgressEvent
from infra.jobs.run import JobReporter
from tests.procs import none_left_in

REPO = Path(__file__).resolve().parents[1]
STAND_IN = REPO / "tests" / "programs" / "stand_in.py"


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(STAND_IN, folder / "stand_in.py")
    yield folder
    none_left_in(folder)


class Recorder(JobReporter):
    """Everything a front end is told, in order."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.events: list[ProgressEvent] = []

    def launched(self, job: Job) -> None:
        self.seen.append(f"launched {job.spec.run_id}")

    @contextlib.contextmanager
    def following(self) -> Iterator[None]:
        self.seen.append("following")
        yield
        self.seen.append("followed")

    def event(self, event: ProgressEvent) -> None:
        self.events.append(event)

    def log(self, line: str) -> None:
        self.seen.append(f"log {line}")


def test_a_program_runs_to_its_end_and_comes_home(workdir: Path, tmp_path: Path) -> None:
    cluster = Cluster(default_config())
    reporter = Recorder()
    result = cluster.run_program(
        ["python", "stand_in.py", "x"],
        env={"USER_A": "1"},
        workdir=workdir,
        dest=tmp_path / "results",
        reporter=reporter,
    )
    run_id = result.spec.run_id
    assert result.exit_code == 0 and result.ok and result.fetched
    result.check()  # success: nothing raised
    assert result.destination == tmp_path / "results" / run_id
    chief = json.loads((result.destination / "chief-0.json").read_text())
    assert chief["run_id"] == run_id and chief["argv"] == ["x"]
    assert chief["env"] == {"USER_A": "1"} and chief["cwd"] == str(workdir)
    # The life as the front end saw it: launched, then followed to the end,
    # the chief's lines in between; the launch's start-up timings as events.
    assert reporter.seen[:2] == [f"launched {run_id}", "following"]
    assert reporter.seen[-1] == "followed"
    assert "log chief says goodbye" in reporter.seen
    assert any(e.kind == "startup" for e in reporter.events)
    # Remembered with its exit code, as `status` shows it; fetched again.
    record = cluster.last_job()
    assert record is not None and (record.run_id, record.exit_code) == (run_id, 0)
    again, where = cluster.fetch(tmp_path / "again")
    assert again.run_id == run_id and (where / "chief-0.json").exists()


def test_a_failed_program_is_a_result_and_check_raises(workdir: Path, tmp_path: Path) -> None:
    cluster = Cluster(default_config())
    result = cluster.run_program(
        ["python", "stand_in.py"], env={"CHIEF_CODE": "5"}, workdir=workdir, dest=tmp_path / "r"
    )
    assert result.exit_code == 5 and not result.ok
    with pytest.raises(JobFailed, match="the chief exited with code 5") as failed:
        result.check()
    assert failed.value.exit_code == 5
    assert any("chief-0 started" in line for line in failed.value.details)
    record = cluster.last_job()
    assert record is not None and record.exit_code == 5


def test_a_detached_program_is_remembered_running(workdir: Path) -> None:
    cluster = Cluster(default_config())
    result = cluster.run_program(
        ["python", "stand_in.py"], env={"CHIEF_SLEEP": "600"}, workdir=workdir, detach=True
    )
    assert result.exit_code is None and not result.ok
    result.check()  # detached: nothing to raise yet
    assert cluster.running_job() is not None
    record, stopped = cluster.cancel()
    assert record.run_id == result.spec.run_id and "chief-0" in " ".join(stopped)


def test_one_node_by_hand(workdir: Path) -> None:
    """`ssh` and `forget-host` as library calls: a local node is a folder
    (no shell), and has no SSH address whose key could be forgotten."""
    cluster = Cluster(default_config())
    cluster.run_program(["python", "stand_in.py"], workdir=workdir)  # brings the nodes up
    shell = cluster.shell("pc-1")
    assert shell.folder == cluster.state.dir / "nodes" / "pc-1" and shell.folder.is_dir()
    with pytest.raises(ConfigError, match="pc-1 is not a node of local with an SSH address"):
        cluster.forget_host("pc-1")
