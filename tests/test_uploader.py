"""The node's uploader (infra/storage/uploader.py) as it runs on a node: a
real process started by the very shell text a node gets
(infra/bucket/commands.py with real bash), watching a real task, writing
through the real google-cloud-storage client to the fake Cloud Storage.

A checkpoint lands while the task still runs; the rest once it ended;
then the uploader ends by itself. A failing upload is one warning and the
others go on; its state is what `down`, `stop` and the job's end read."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.bucket import commands as upload_commands
from infra.node import commands
from infra.storage.uploader import task_alive
from infra.transport.base import NodeLayout
from tests.fake_gcs.server import FakeGcs

REPO = Path(__file__).resolve().parents[1]
URL = "gs://tfc-runs/team/c1/r1"


@pytest.fixture
def fake() -> Iterator[FakeGcs]:
    with FakeGcs() as server:
        server.create_bucket("tfc-runs")
        yield server


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "node"
    (home / "tfcluster" / "runs" / "r1").mkdir(parents=True)
    yield home
    # Whatever the test did: the watched task ends, and with it the uploader.
    (home / "stop").write_text("")
    states(home, wait_s=60)
    assert not task_alive(home / "tfcluster" / "logs" / "upload-r1.pid")


LAYOUT = NodeLayout(
    root="tfcluster",
    code=str(REPO),
    python=str(Path(sys.executable).parent / "python"),
    runs="tfcluster/runs",
    logs="tfcluster/logs",
)


def bash(home: Path, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script], cwd=home, capture_output=True, text=True, timeout=60
    )


def start_chief(home: Path, run_id: str = "r1", stop: str = "stop") -> None:
    """The watched task, as a job starts it: a chief of run ``run_id``
    that runs until the file ``stop`` is there."""
    chief = commands.start_task(
        LAYOUT, "chief-0", ["bash", "-c", f"while [ ! -e {stop} ]; do sleep 0.1; done; exit 0"],
        {"TFCLUSTER_RUN_ID": run_id},
    )  # fmt: skip
    assert bash(home, chief).returncode == 0


def start(home: Path, fake: FakeGcs, interval: float = 0.5) -> None:
    start_chief(home)
    script = upload_commands.start_uploader(
        LAYOUT, run_id="r1", run_dir="tfcluster/runs/r1", watch_task="chief-0", url=URL,
        endpoint=fake.endpoint, credentials="anonymous",
        record={"run_id": "r1", "label": "cnn, async", "started_at": "2026-11-26T07:00:00+00:00"},
    )  # fmt: skip
    # The interval is a flag of the uploader: a test need not wait 5 s.
    script = script.replace("--status", f"--interval {interval} --status", 1)
    result = bash(home, script)
    assert result.returncode == 0, result.stderr
    assert "started upload-r1" in result.stdout


def states(home: Path, wait_s: float = 0.0) -> list[upload_commands.UploadState]:
    out = bash(home, upload_commands.uploads(LAYOUT, wait_s)).stdout
    return upload_commands.parse_uploads(out)


def wait_for(condition: object, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if callable(condition) and condition():
            return
        time.sleep(0.1)
    raise AssertionError("not within the time")


def test_checkpoints_while_running_the_rest_at_the_end_then_it_ends(
    fake: FakeGcs, node: Path
) -> None:
    run = node / "tfcluster" / "runs" / "r1"
    (run / "checkpoints").mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    start(node, fake)
    (run / "checkpoints" / "ckpt-10.index").write_bytes(b"i" * 100)
    (run / "checkpoints" / "ckpt-10.data-00000-of-00001").write_bytes(b"d" * 5000)
    (run / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-10"\n')
    prefix = "team/c1/r1/"
    wait_for(lambda: f"{prefix}checkpoints/checkpoint" in fake.names("tfc-runs"))
    names = fake.names("tfc-runs")
    # The checkpoint while the chief runs, its index last; the rest not yet.
    assert f"{prefix}checkpoints/ckpt-10.index" in names
    assert f"{prefix}metrics.jsonl" not in names
    order = fake.writes
    assert order.index(f"{prefix}checkpoints/checkpoint") > order.index(
        f"{prefix}checkpoints/ckpt-10.index"
    )
    record = json.loads(fake.read("tfc-runs", f"{prefix}tfcluster-run.json"))
    assert record["status"] == "running" and record["label"] == "cnn, async"
    [state] = states(node)
    assert state.alive and not state.done

    (run / "summary.json").write_text('{"test_accuracy": 0.9}')
    (run / "checkpoints" / "ckpt-10.index").unlink()  # an old checkpoint the run let go
    (node / "stop").write_text("")
    [state] = states(node, wait_s=30)
    assert not state.alive and state.done and state.pending_count == 0
    assert fake.read("tfc-runs", f"{prefix}summary.json") == b'{"test_accuracy": 0.9}'
    assert f"{prefix}checkpoints/ckpt-10.index" not in fake.names("tfc-runs")
    record = json.loads(fake.read("tfc-runs", f"{prefix}tfcluster-run.json"))
    assert record["status"] == "done" and record["exit_code"] == 0
    assert not task_alive(node / "tfcluster" / "logs" / "upload-r1.pid")


def test_a_file_that_keeps_failing_is_one_warning_and_the_rest_lands(
    fake: FakeGcs, node: Path
) -> None:
    run = node / "tfcluster" / "runs" / "r1"
    (run / "a.txt").write_text("a")
    (run / "b.txt").write_text("b")
    start(node, fake)
    # a.txt is refused for good (403: the client does not retry it; the
    # uploader tries it whole three times, in two passes at the end).
    fake.fail(403, name="team/c1/r1/a.txt", times=1000)
    (node / "stop").write_text("")
    [state] = states(node, wait_s=60)
    assert not state.alive and state.done
    assert list(state.failed) == ["a.txt"]
    assert fake.names("tfc-runs", "team/c1/r1/b.txt") == ["team/c1/r1/b.txt"]
    log = (node / "tfcluster" / "logs" / "upload-r1.log").read_text()
    assert log.count("warning: could not upload a.txt") == 1


def test_the_next_jobs_chief_of_the_same_name_is_not_the_one_it_outlives(
    fake: FakeGcs, node: Path
) -> None:
    """The uploader watches the chief by its pid file, which the next job's
    chief (of the same name, chief-0) takes over. Busy with a checkpoint
    when its chief ends (here: the bucket answers its upload 15 s late),
    and the next job started meanwhile (`cancel`, then `run` at once), it
    must still see its own chief gone and finish: not mirror on, its
    summary out of the bucket and its record "running", until the other
    job ends."""
    run = node / "tfcluster" / "runs" / "r1"
    (run / "checkpoints").mkdir()
    start(node, fake)
    fake.slow(15, suffix="/checkpoints/ckpt-1.index")
    (run / "checkpoints" / "ckpt-1.index").write_bytes(b"i")
    wait_for(lambda: any(c.path.startswith("/upload/") for c in fake.calls))  # on its way
    (node / "stop").write_text("")
    wait_for(lambda: (node / "tfcluster" / "logs" / "chief-0.exit").exists())
    (run / "summary.json").write_text("{}")
    start_chief(node, run_id="r2", stop="stop-r2")  # the next job's chief
    try:
        [state] = states(node, wait_s=45)
        assert not state.alive and state.done, state
        assert "team/c1/r1/summary.json" in fake.names("tfc-runs")
        record = json.loads(fake.read("tfc-runs", "team/c1/r1/tfcluster-run.json"))
        assert record["status"] != "running"
    finally:
        (node / "stop-r2").write_text("")


def test_the_parser_skips_what_is_not_a_state(fake: FakeGcs) -> None:
    good = '@tfcluster-upload upload-r1 1 {"url": "gs://b/r1", "uploaded": 2, "bytes": 9, "done": false}'
    lines = "\n".join(
        [good, "@tfcluster-upload upload-r2 0 {torn", "noise", "@tfcluster-upload x 0 {}"]
    )
    [state] = upload_commands.parse_uploads(lines)
    assert state.run_id == "r1" and state.alive and state.uploaded == 2
    # One just started has no state yet: it runs all the same.
    [starting] = upload_commands.parse_uploads("@tfcluster-upload upload-r3 1 {}")
    assert starting.alive and starting.url == "" and not starting.done


@pytest.mark.parametrize(
    "field",
    ['"uploaded": 1e999', '"bytes": -1e999', '"bytes": 1' + "0" * 400, '"pending_count": -1',
     '"uploaded": true', '"bytes": 2.5', '"uploaded": "12"'],
)  # fmt: skip
def test_a_state_whose_counts_are_not_counts_is_skipped(field: str) -> None:
    """A node's state file is its text: a count that is not one (infinity
    made int() raise OverflowError, a 400-digit one made the job's last
    line's MB raise it) is no state, never a traceback."""
    line = f'@tfcluster-upload upload-r1 1 {{"url": "gs://b/r1", {field}}}'
    assert upload_commands.parse_uploads(line) == []
    [state] = upload_commands.parse_uploads('@tfcluster-upload upload-r1 0 {"bytes": 10000000}')
    outcome = upload_commands.BucketOutcome(state.url, state.uploaded, state.bytes, (), {}, True)
    assert "(0 files, 10.0 MB)" in outcome.text()


def test_a_checkpoint_index_waits_for_the_files_it_names(tmp_path: Path) -> None:
    from infra.storage.uploader import Mirror
    from infra.storage.urls import GsUrl

    sent: list[str] = []

    def upload(path: str, local: Path) -> int:
        sent.append(path)
        return local.stat().st_size

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    data = run / "checkpoints" / "ckpt-20.data-00000-of-00001"
    data.write_bytes(b"1")
    (run / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-20"\n')
    (run / "metrics.jsonl").write_text("{}\n")
    mirror = Mirror(run, GsUrl("b", "r"), upload, lambda p: None, lambda line: None)
    mirror.pass_(final=False)
    assert sent == []  # seen once: not known to be stable yet
    data.write_bytes(b"12")  # still being written
    mirror.pass_(final=False)
    assert sent == []  # the index is stable, but its data file is not: neither goes
    mirror.pass_(final=False)
    assert sent == ["checkpoints/ckpt-20.data-00000-of-00001", "checkpoints/checkpoint"]
    mirror.pass_(final=True)
    assert sent[-1] == "metrics.jsonl"


def test_a_folder_the_run_removes_while_it_is_looked_at_is_no_crash(tmp_path: Path) -> None:
    """Each TensorFlow checkpoint save makes a ``ckpt-N_temp`` folder and
    removes it once merged (and the run removes old checkpoints): the
    uploader's look at the run folder meets entries that vanish under it.
    A walk that raised on one (pathlib's rglob does) ended the uploader
    with a traceback: no last pass, the summary never in the bucket, the
    record "running" for ever, and `down` not waiting for a dead uploader."""
    from infra.storage.uploader import Mirror
    from infra.storage.urls import GsUrl

    for _ in range(5):  # each round all but certain to meet one without the fix
        run = Path(tempfile.mkdtemp(dir=tmp_path)) / "run"
        folders = [run / "checkpoints" / f"ckpt-{i}_temp" for i in range(300)]
        for folder in folders:
            folder.mkdir(parents=True)
            (folder / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x")
        (run / "summary.json").write_text("{}")
        mirror = Mirror(run, GsUrl("b", "r"), lambda p, f: 0, lambda p: None, lambda line: None)

        def save(gone: list[Path]) -> None:  # each checkpoint save removes its _temp folder
            for folder in gone:
                shutil.rmtree(folder)

        saver = threading.Thread(target=save, args=(folders,))
        saver.start()
        while saver.is_alive():
            assert "summary.json" in mirror.files()
        saver.join()


def test_a_file_the_run_removed_before_its_upload_is_not_a_failure(
    fake: FakeGcs, tmp_path: Path
) -> None:
    """An old checkpoint the run removes while its upload waits (a slow
    bucket, frequent checkpoints) is gone, not "not in the bucket"."""
    from infra.storage import transfer
    from infra.storage.uploader import Mirror
    from infra.storage.urls import GsUrl

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    old = run / "checkpoints" / "ckpt-1.index"
    old.write_bytes(b"i")
    (run / "summary.json").write_text("{}")
    bucket = transfer.make_client(fake.endpoint, "anonymous").bucket("tfc-runs")
    warnings: list[str] = []

    def upload(path: str, local: Path) -> int:
        if local == old:
            old.unlink()  # the run lets it go just now
        return transfer.upload_file(bucket, f"r/{path}", local, sleep=lambda s: None)

    mirror = Mirror(run, GsUrl("tfc-runs", "r"), upload, lambda p: None, warnings.append)
    mirror.pass_(final=True)
    assert warnings == [] and mirror.failed == {}
    assert mirror.status(done=True)["pending_count"] == 0
    assert fake.names("tfc-runs") == ["r/summary.json"]
