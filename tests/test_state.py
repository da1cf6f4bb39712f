"""The state file: updates from racing processes, atomic writes, and a
corrupt file set aside with one warning (the provider rebuilds the rest)."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from deploy import cli
from infra.cluster.api import Cluster
from infra.config.loader import default_config
from infra.jobs.job import Job
from infra.providers.local import LocalTransport
from infra.spec.job import JobRecord, JobSpec, Program
from infra.spec.tfconfig import TaskSpec
from infra.state.folder import ClusterState


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _updates(barrier: object, worker: int, count: int) -> None:
    barrier.wait()  # type: ignore[attr-defined]
    state = ClusterState("c")
    for i in range(count):
        state.update(**{f"w{worker}-{i}": i})


def test_concurrent_updates_lose_nothing(tfcluster_home: Path) -> None:
    """8 processes x 30 updates of distinct keys: each read-modify-write
    used to overwrite the others' (39 of 300 lost in the review)."""
    ctx = multiprocessing.get_context("fork")
    workers, count = 8, 30
    barrier = ctx.Barrier(workers)
    procs = [ctx.Process(target=_updates, args=(barrier, w, count)) for w in range(workers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    data = ClusterState("c").load()
    missing = [f"w{w}-{i}" for w in range(workers) for i in range(count) if f"w{w}-{i}" not in data]
    assert missing == []
    # Nothing left behind: no temp file, no file set aside.
    names = sorted(p.name for p in ClusterState("c").dir.iterdir())
    assert names == ["state.json", "state.lock"]


def test_state_file_and_folder_modes(tfcluster_home: Path) -> None:
    state = ClusterState("c")
    state.dir.mkdir(parents=True, mode=0o755)
    os.chmod(state.dir, 0o755)
    state.update(a=1)
    assert stat.S_IMODE(state.file.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.dir.stat().st_mode) == 0o700
    assert state.get("a") == 1


# -- a corrupt state file --------------------------------------------------------------

GOOD_JOB: dict[str, Any] = {
    "run_id": "cnn-async-20260101-000000",
    "chief_node": "pc-1",
    "output_dir": "tfcluster/runs/cnn-async-20260101-000000",
    "tasks": [
        {"type": "ps", "index": 0, "node": "pc-1", "host": "127.0.0.1", "port": 2222},
        {"type": "chief", "index": 0, "node": "pc-1", "host": "127.0.0.1", "port": 2223},
    ],
    "started_at": "2026-01-01T00:00:00+00:00",
    "exit_code": None,
    "command": ["python", "-m", "trainer"],
    "model": "cnn",
    "mode": "async",
}


def _job(**changes: Any) -> dict[str, Any]:
    job = {**GOOD_JOB, **changes}
    return {k: v for k, v in job.items() if v is not _DROP}


_DROP = object()


def _write_folder(path: Path) -> None:
    path.mkdir()
    (path / "x").write_text("x")


CORRUPT = {
    "a folder": _write_folder,
    "binary": lambda p: p.write_bytes(b"\x00\xff\xfe binary \x80"),
    "torn json": lambda p: p.write_text('{"nodes": {"pc-1": {"status"'),
    "a list": lambda p: p.write_text("[1, 2]"),
    "partial last_job": lambda p: p.write_text(json.dumps({"last_job": {"run_id": "x"}})),
    "last_job of wrong types": lambda p: p.write_text(
        json.dumps({"last_job": _job(tasks="pc-1", exit_code="0")})
    ),
    "last_job that climbs out": lambda p: p.write_text(
        json.dumps({"last_job": _job(run_id="../../etc", output_dir="/etc")})
    ),
    "a symlink": lambda p: p.symlink_to("/etc/hostname"),
}


@pytest.mark.parametrize("kind", list(CORRUPT))
def test_a_corrupt_state_file_is_set_aside_with_one_warning(kind: str) -> None:
    state = ClusterState("local")
    state.ensure_dir()
    CORRUPT[kind](state.file)
    code, out = run("status")
    assert code == 0, out
    assert "unexpected failure" not in out and "Traceback" not in out
    words = " ".join(out.split())
    assert out.count("WARNING") == 1 and words.count("set aside as state.json.corrupt-") == 1, out
    (aside,) = state.dir.glob("state.json.corrupt-*")
    assert aside.is_symlink() or aside.exists()
    # Rebuilt from the provider: a valid object again, and no second warning.
    assert isinstance(json.loads(state.file.read_text()), dict)
    code, out = run("status")
    assert code == 0 and "set aside" not in out


@pytest.mark.parametrize("kind", ["partial last_job", "last_job of wrong types"])
def test_a_broken_last_job_is_no_last_job(kind: str) -> None:
    """cancel, train --resume and fetch used to crash on it (exit 70)."""
    state = ClusterState("local")
    state.ensure_dir()
    CORRUPT[kind](state.file)
    code, out = run("cancel")
    assert code == 3 and "no job to cancel" in out, out
    assert out.count("WARNING") == 1 and "set aside" in " ".join(out.split())
    code, out = run("train", "--resume")
    assert code == 3 and "nothing to resume" in out
    code, out = run("fetch")
    assert code == 3 and "no job to fetch" in out


def test_a_state_set_aside_keeps_its_cluster_id() -> None:
    """A broken last job set the whole state aside, the cluster's id with
    it: a new id was made, and the cluster lost its own (provider ssh: its
    folder on the hosts and the job running there; GCE: its nodes, refused
    as another person's). The id, when it is sound, stays."""
    state = ClusterState("local")
    state.update(cluster_id="0123456789ab", last_job=_job(tasks="pc-1"))
    assert ClusterState("local").cluster_id() == "0123456789ab"
    assert len(list(state.dir.glob("state.json.corrupt-*"))) == 1
    assert ClusterState("local").cluster_id() == "0123456789ab"
    assert json.loads(state.file.read_text()) == {"cluster_id": "0123456789ab"}


def test_a_good_last_job_is_kept() -> None:
    state = ClusterState("local")
    state.update(last_job=GOOD_JOB)
    record = Cluster(default_config()).last_job()
    assert record is not None and record.run_id == GOOD_JOB["run_id"]
    assert not list(state.dir.glob("state.json.corrupt-*"))


@pytest.mark.parametrize(
    "changes",
    [
        {"run_id": _DROP},
        {"chief_node": 3},
        {"output_dir": ""},
        {"run_id": "../x", "output_dir": "runs/../x"},
        {"output_dir": "/home/u/tfcluster/runs/other-run"},
        {"tasks": [{"type": "chief", "index": 0, "node": "pc-1", "host": "h"}]},
        {"tasks": [{"type": "chief", "index": True, "node": "pc-1", "host": "h", "port": 1}]},
        {"tasks": [{"type": "chief", "index": 0, "node": "../pc", "host": "h", "port": 1}]},
        {"tasks": [{"type": "boss", "index": 0, "node": "pc-1", "host": "h", "port": 1}]},
        {"tasks": [{"type": "chief", "index": 0, "node": "pc-1", "host": "h", "port": 70000}]},
        {"tasks": []},
        {"exit_code": "1"},
        {"exit_code": False},
        {"command": "python train.py"},
        {"command": [1, 2]},
        {"model": 5},
    ],
)
def test_job_record_from_dict_refuses_a_broken_record(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        JobRecord.from_dict(_job(**changes))


def test_job_record_from_dict_reads_what_record_writes() -> None:
    transport = LocalTransport(["pc-1"], ClusterState("local").dir / "nodes")
    tasks = [TaskSpec("chief", 0, "pc-1", "127.0.0.1", 2222)]
    job = Job(transport, tasks, JobSpec("cnn-sync-20260101-000000", Program(argv=("x",), task_types=("chief",))))
    record = job.record()
    assert JobRecord.from_dict(json.loads(json.dumps(record.__dict__))) == record
    assert JobRecord.from_dict({k: v for k, v in GOOD_JOB.items() if k != "model"}).model is None


def test_a_late_watcher_does_not_overwrite_a_newer_job() -> None:
    """A job's end is recorded without the cluster lock: if a newer job was
    launched meanwhile (after a cancel), it stays the last job."""
    cluster = Cluster(default_config())
    transport = LocalTransport(["pc-1"], cluster.state.dir / "nodes")
    tasks = [TaskSpec("chief", 0, "pc-1", "127.0.0.1", 2222)]
    old = Job(transport, tasks, JobSpec("old-20260101-000000", Program(argv=("x",), task_types=("chief",))))
    new = Job(transport, tasks, JobSpec("new-20260101-000001", Program(argv=("x",), task_types=("chief",))))
    cluster.remember(old)
    cluster.remember(new)
    cluster.remember(old, exit_code=-1)  # the old one's watcher, ending late
    last = cluster.last_job()
    assert last is not None and last.run_id == "new-20260101-000001" and last.exit_code is None
    cluster.remember(new, exit_code=0)
    last = cluster.last_job()
    assert last is not None and last.exit_code == 0
