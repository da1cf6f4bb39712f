"""A local cluster whose runs land in a bucket (the fake Cloud Storage on
this machine), through deploy.py: `up` checks the bucket before it creates
anything; a real training's chief node uploads its run folder (a 503 on
the way is survived); `runs` lists it; after `down --yes`, `fetch` brings
it home from the bucket; a program sees TFCLUSTER_BUCKET_URL."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from deploy import cli
from tests.fake_gcs.server import OBJECT_ADMIN, FakeGcs, service_account_key
from tests.procs import none_left_in

REPO = Path(__file__).resolve().parents[1]
STAND_IN = REPO / "tests" / "programs" / "stand_in.py"


@pytest.fixture
def fake() -> Iterator[FakeGcs]:
    with FakeGcs() as server:
        yield server


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")


DeployPopen = Callable[..., "subprocess.Popen[str]"]


@pytest.fixture
def deploy_popen() -> Iterator[DeployPopen]:
    """``deploy_popen(config, *args)``: deploy.py in the background, its
    output piped, killed at the test's end if it still runs (a test that
    fails before its Ctrl-C must not leave a `down` waiting for uploads)."""
    started: list[subprocess.Popen[str]] = []

    def start(config: Path, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "deploy.py"), "--config", str(config), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, COLUMNS="400"),
        )  # fmt: skip
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def write_config(folder: Path, fake: FakeGcs, **extra: Any) -> Path:
    config = {
        "name": "bkt",
        "provider": "local",
        "nodes": ["pc-1", "pc-2"],
        "roles": {"ps": "pc-1", "chief": "pc-1", "worker": "pc-2"},
        "job": {"mode": "async", "steps": 20, "checkpoint_every": 10, "batch_size": 32},
        "storage": {"bucket": "gs://tfc-runs/team", "endpoint": fake.endpoint,
                    "credentials": "anonymous"},
        **extra,
    }  # fmt: skip
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run(config: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--config", str(config), *args], catch_exceptions=False)
    return result.exit_code, result.output


def test_up_refuses_a_missing_bucket_before_creating_anything(
    fake: FakeGcs, tmp_path: Path
) -> None:
    config = write_config(tmp_path, fake)
    code, out = run(config, "up")
    assert code == 2, out
    assert "bucket tfc-runs does not exist" in out and "gcloud storage buckets create" in out
    code, out = run(config, "status", "--json")
    assert [n["state"] for n in json.loads(out)] == ["absent", "absent"]


def test_up_refuses_a_bucket_it_may_not_write(fake: FakeGcs, tmp_path: Path) -> None:
    fake.create_bucket("tfc-runs", permissions={"storage.objects.get", "storage.objects.list"})
    code, out = run(write_config(tmp_path, fake), "up")
    assert code == 2, out
    assert "anonymous (no credentials) may not write runs there" in out
    assert "roles/storage.objectAdmin on that bucket" in out
    assert "storage.objects.create" in out


def test_a_training_lands_in_the_bucket_and_comes_home_after_down(
    fake: FakeGcs, tmp_path: Path, mnist_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MNIST_DIR", str(mnist_dir))
    fake.create_bucket("tfc-runs")
    config = write_config(tmp_path, fake)
    code, out = run(config, "up")
    assert code == 0, out
    # The first multipart upload (a checkpoint or the run's record) fails
    # with a 503 once: the client sends it again.
    fake.fail(503, upload="multipart")
    code, out = run(config, "train")
    assert code == 0, out
    assert fake.failures_left() == 0
    [run_id] = [p.name for p in (Path("runs") / "bkt").iterdir()]
    prefix = f"team/bkt/{run_id}/"
    names = fake.names("tfc-runs", prefix)
    assert f"in the bucket: gs://tfc-runs/{prefix}" in out
    for wanted in ("summary.json", "metrics.jsonl", "checkpoints/checkpoint", "tfcluster-run.json"):
        assert prefix + wanted in names, names
    assert any(n.startswith(prefix + "checkpoints/ckpt-") and n.endswith(".index") for n in names)
    record = json.loads(fake.read("tfc-runs", prefix + "tfcluster-run.json"))
    assert record["status"] == "done" and record["label"] == "cnn, async"

    code, out = run(config, "runs", "--json")
    assert code == 0, out
    [listed] = json.loads(out)
    assert (listed["run_id"], listed["status"]) == (run_id, "done") and listed["size"] > 0

    code, out = run(config, "down", "--yes")
    assert code == 0, out
    shutil.rmtree(Path("runs"))
    code, out = run(config, "fetch")
    assert code == 0, out
    assert f"fetched {run_id} from gs://tfc-runs/{prefix[:-1]}" in out
    summary = json.loads((Path("runs") / "bkt" / run_id / "summary.json").read_text())
    assert summary["steps"] == 20

    # A new cluster on a machine that knows no earlier job (its state
    # folder gone): --resume finds the last training in the bucket and
    # its chief restores the checkpoint from there.
    shutil.rmtree(os.environ["TFCLUSTER_HOME"])
    code, out = run(config, "up")
    assert code == 0, out
    code, out = run(config, "train", "--resume", "--steps", "30", "--dest", str(tmp_path / "r"))
    assert code == 0, out
    resumed = json.loads((tmp_path / "r" / run_id / "summary.json").read_text())
    assert resumed["resumed_from_step"] == 20 and resumed["steps"] == 30


def test_a_program_sees_its_bucket_folder(
    fake: FakeGcs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.create_bucket("tfc-runs")
    work = tmp_path / "project"
    work.mkdir()
    shutil.copy(STAND_IN, work / "stand_in.py")
    config = write_config(tmp_path, fake, job={"workdir": str(work)})
    code, out = run(config, "run", "--no-ps", "--", "python", "stand_in.py")
    assert code == 0, out
    [run_dir] = list((Path("runs") / "bkt").iterdir())
    seen = json.loads((run_dir / "chief-0.json").read_text())
    assert seen["bucket_url"] == f"gs://tfc-runs/team/bkt/{run_dir.name}"
    assert f"team/bkt/{run_dir.name}/chief-0.json" in fake.names("tfc-runs")
    none_left_in(work)


@pytest.mark.parametrize(
    "run_arg", ["a/b", "gs://tfc-runs/team/../x", "gs://", "gs://UPPER/x"]
)
def test_fetch_refuses_bad_names(fake: FakeGcs, tmp_path: Path, run_arg: str) -> None:
    fake.create_bucket("tfc-runs")
    code, out = run(write_config(tmp_path, fake), "fetch", run_arg)
    assert code == 2, out
    assert [line for line in out.splitlines() if line.startswith("error:")]
    assert not Path("runs").exists()


def test_fetch_refuses_objects_that_leave_the_run_folder(fake: FakeGcs, tmp_path: Path) -> None:
    fake.create_bucket("tfc-runs")
    fake.put("tfc-runs", "team/bkt/r1/summary.json", b"{}")
    fake.put("tfc-runs", "team/bkt/r1/../../evil", b"x")
    fake.put("tfc-runs", "team/bkt/r1//etc/passwd", b"x")
    code, out = run(write_config(tmp_path, fake), "fetch", "r1", "--dest", str(tmp_path / "d"))
    assert code == 7, out
    assert "leaves the run folder; nothing was fetched" in out
    assert not (tmp_path / "d").exists() and not (tmp_path / "evil").exists()


@pytest.mark.parametrize(
    ("limits", "words"),
    [({"max_entries": 2}, "past 2 files and folders (fetch.max_entries)"),
     ({"max_gb": 1.6e-8}, "past 1.6e-08 GB (fetch.max_gb)")],
)  # fmt: skip
def test_a_run_from_the_bucket_is_held_to_the_fetch_limits(
    fake: FakeGcs, tmp_path: Path, limits: dict[str, float], words: str
) -> None:
    """The nodes wrote what is in the bucket: a run folder past fetch.max_gb
    or fetch.max_entries is refused there as it is on the nodes (the fetch
    from the nodes falls back to the bucket), before anything is written."""
    fake.create_bucket("tfc-runs")
    for name in ("a", "b", "c"):
        fake.put("tfc-runs", f"team/bkt/r1/{name}", b"x" * 6)
    code, out = run(write_config(tmp_path, fake, fetch=limits), "fetch", "r1",
                    "--dest", str(tmp_path / "d"))  # fmt: skip
    assert code == 7, out
    assert f"gs://tfc-runs/team/bkt/r1: 'c' takes the run folder {words}" in out
    assert not (tmp_path / "d").exists()


def test_folder_markers_are_folders_not_names_that_leave_the_run(
    fake: FakeGcs, tmp_path: Path
) -> None:
    """A zero-byte object named like a folder ('eval/') is how the Cloud
    console's "Create folder" and TensorFlow's ``tf.io.gfile.makedirs`` on
    gs:// (README's example, in the run's own folder) make a folder: the
    run is fetched whole, the markers written as nothing."""
    fake.create_bucket("tfc-runs")
    fake.put("tfc-runs", "team/bkt/r1/", b"")  # makedirs marks each level it makes
    fake.put("tfc-runs", "team/bkt/r1/eval/", b"")
    fake.put("tfc-runs", "team/bkt/r1/eval/result.txt", b"0.9")
    fake.put("tfc-runs", "team/bkt/r1/summary.json", b"{}")
    dest = tmp_path / "d"
    code, out = run(write_config(tmp_path, fake), "fetch", "r1", "--dest", str(dest))
    assert code == 0, out
    assert (dest / "r1" / "eval" / "result.txt").read_bytes() == b"0.9"
    assert sorted(p.name for p in (dest / "r1").iterdir()) == ["eval", "summary.json"]


def test_a_data_folder_made_in_the_console_is_copied(fake: FakeGcs, tmp_path: Path) -> None:
    from infra.storage import uploader

    fake.create_bucket("tfc-runs")
    fake.put("tfc-runs", "data/mnist/", b"")  # the console's "Create folder"
    fake.put("tfc-runs", "data/mnist/train.gz", b"images")
    cache = tmp_path / "cache"
    code = uploader.main(["--endpoint", fake.endpoint, "--credentials", "anonymous", "data",
                          "--url", "gs://tfc-runs/data/mnist", "--dest", str(cache)])  # fmt: skip
    assert code == 0
    assert (cache / "train.gz").read_bytes() == b"images"


def test_a_marker_with_bytes_is_refused_as_any_name_that_is_not_a_file(
    fake: FakeGcs, tmp_path: Path
) -> None:
    fake.create_bucket("tfc-runs")
    fake.put("tfc-runs", "team/bkt/r1/summary.json", b"{}")
    fake.put("tfc-runs", "team/bkt/r1/eval/", b"not a marker")
    code, out = run(write_config(tmp_path, fake), "fetch", "r1", "--dest", str(tmp_path / "d"))
    assert code == 7, out
    assert "leaves the run folder; nothing was fetched" in out
    assert not (tmp_path / "d").exists()


def test_each_sweep_trial_lands_in_the_bucket(fake: FakeGcs, tmp_path: Path) -> None:
    fake.create_bucket("tfc-runs")
    work = tmp_path / "project"
    work.mkdir()
    (work / "trial.py").write_text(
        "import os, pathlib, sys\n"
        "out = pathlib.Path(os.environ['TFCLUSTER_RUN_DIR']) / 'out.txt'\n"
        "out.write_text(sys.argv[1] + ' ' + os.environ['TFCLUSTER_BUCKET_URL'])\n"
    )
    config = write_config(tmp_path, fake, job={"workdir": str(work)})
    code, out = run(config, "sweep", "--param", "x=1,2", "--", "python", "trial.py", "{x}")
    assert code == 0, out
    [sweep_dir] = list((Path("runs") / "bkt").iterdir())
    prefix = f"team/bkt/{sweep_dir.name}/"
    for trial, x in (("trial-0", "1"), ("trial-1", "2")):
        text = fake.read("tfc-runs", f"{prefix}{trial}/out.txt").decode()
        assert text == f"{x} gs://tfc-runs/{prefix}{trial}"
        record = json.loads(fake.read("tfc-runs", f"{prefix}{trial}/tfcluster-run.json"))
        assert record["status"] == "done"
    none_left_in(work)


def test_report_and_tensorboard_of_a_run_in_the_bucket(fake: FakeGcs, tmp_path: Path) -> None:
    from infra.cluster.api import Cluster
    from infra.config.loader import load_config

    fake.create_bucket("tfc-runs")
    summary = {"run_id": "r1", "model": "cnn", "mode": "async", "workers": 2, "steps": 20,
               "training_seconds": 3.0, "examples_per_sec": 200.0, "test_accuracy": 0.5}  # fmt: skip
    fake.put("tfc-runs", "team/bkt/r1/summary.json", json.dumps(summary).encode())
    fake.put("tfc-runs", "team/bkt/r1/tensorboard/events.out.tfevents.1", b"")
    config = write_config(tmp_path, fake)
    code, out = run(config, "report", "gs://tfc-runs/team/bkt/r1", "--json")
    assert code == 0, out
    [row] = json.loads(out)
    assert (row["run"], row["metric"], row["value"]) == ("r1", "test_accuracy", 0.5)
    code, out = run(config, "report", "r1", "--json")  # a run id, no such folder here
    assert code == 0, out
    # A folder here with a typo in it is said to be missing, as without a bucket.
    code, out = run(config, "report", "runs/bkt/r1-typo")
    assert code == 2, out
    assert "runs/bkt/r1-typo: no such run folder" in out and "not a run id" not in out

    import urllib.request

    cluster = Cluster(load_config(config))
    with cluster.tensorboard("gs://tfc-runs/team/bkt/r1") as (board, _wait):
        with urllib.request.urlopen(board.url, timeout=30) as answer:
            assert answer.status == 200
        assert board.logdir.endswith("r1")


def test_the_trainer_reads_mnist_from_the_bucket_checked_by_its_sums(
    fake: FakeGcs, tmp_path: Path, mnist_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MNIST_DIR", raising=False)
    fake.create_bucket("tfc-runs")
    for file in sorted(mnist_dir.iterdir()):
        fake.put("tfc-runs", f"data/mnist/{file.name}", file.read_bytes())
    config = write_config(tmp_path, fake)
    args = ["train", "--steps", "10", "--data-dir", "gs://tfc-runs/data/mnist"]
    code, out = run(config, *args)
    assert code == 0, out
    caches = list(Path(os.environ["TFCLUSTER_HOME"]).rglob("cache/gcs/tfc-runs/data/mnist"))
    assert len(caches) == 2  # once per node (pc-1 runs the ps and the chief)
    assert all((c / "train-images-idx3-ubyte.gz").is_file() for c in caches)
    downloads = sum(1 for c in fake.calls if "train-images" in c.path and c.method == "GET")
    assert downloads == 2

    # A file that no longer matches the folder's SHA256SUMS: copied again
    # (its generation changed), and refused as a local folder would be.
    fake.put("tfc-runs", "data/mnist/t10k-labels-idx1-ubyte.gz", b"not the labels")
    code, out = run(config, *args)
    assert code != 0, out
    assert "t10k-labels-idx1-ubyte.gz is corrupted: SHA-256" in out


def test_data_from_a_bucket_needs_no_storage_section(
    fake: FakeGcs, tmp_path: Path, mnist_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`train --data-dir gs://...` reads data in any bucket, with the
    nodes' own credentials (here this machine's application default ones
    and the emulator variable), as a cluster without a bucket for its runs:
    it said "has no storage section: runs are only on the nodes" (exit 3)."""
    monkeypatch.delenv("MNIST_DIR", raising=False)
    fake.create_bucket("tfc-data")
    for file in sorted(mnist_dir.iterdir()):
        fake.put("tfc-data", f"mnist/{file.name}", file.read_bytes())
    key = tmp_path / "reader.json"
    key.write_text(json.dumps(service_account_key(fake, "reader@proj.iam.gserviceaccount.com")))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake.endpoint)
    config = tmp_path / "cluster.yaml"
    config.write_text(yaml.safe_dump({"name": "data", "provider": "local", "job": {"steps": 5}}))
    code, out = run(config, "train", "--data-dir", "gs://tfc-data/mnist")
    assert code == 0, out
    assert fake.accounts() == {"reader@proj.iam.gserviceaccount.com"}


def test_an_uploader_that_cannot_start_says_why(fake: FakeGcs, tmp_path: Path) -> None:
    """The node's credentials unusable there (an ssh host without
    application default credentials; here a key file broken after `up`
    checked it): the uploader ended at once, and the job's last line said
    "in the bucket: / (0 files, 0 bytes)"; a data copy's error was the
    tail of a traceback."""
    email = "writer@proj.iam.gserviceaccount.com"
    key = tmp_path / "writer.json"
    key.write_text(json.dumps(service_account_key(fake, email)))
    fake.create_bucket("tfc-runs")
    work = tmp_path / "project"
    work.mkdir()
    shutil.copy(STAND_IN, work / "stand_in.py")
    config = write_config(tmp_path, fake, job={"workdir": str(work)})
    data = yaml.safe_load(config.read_text())
    data["storage"]["credentials"] = "writer.json"
    config.write_text(yaml.safe_dump(data))
    code, out = run(config, "up")
    assert code == 0, out
    key.write_text("{not json")
    code, out = run(config, "run", "--no-ps", "--", "python", "stand_in.py")
    assert code == 0, out
    assert "in the bucket: /" not in out
    assert "the upload to gs://tfc-runs/team/bkt/stand-in-" in out
    assert "could not start: JSONDecodeError: Expecting property name" in out, out
    code, out = run(config, "train", "--steps", "5", "--data-dir", "gs://tfc-runs/mnist")
    assert code != 0, out
    assert "Traceback" not in out and 'File "' not in out, out
    assert "could not copy gs://tfc-runs/mnist: error: JSONDecodeError: Expecting" in out, out
    none_left_in(work)


def test_down_stops_a_running_job_and_waits_for_its_upload(
    fake: FakeGcs, tmp_path: Path
) -> None:
    fake.create_bucket("tfc-runs")
    work = tmp_path / "project"
    work.mkdir()
    shutil.copy(STAND_IN, work / "stand_in.py")
    config = write_config(tmp_path, fake, job={"workdir": str(work)})
    # A job nobody waits for.
    code, out = run(config, "run", "--no-ps", "--detach", "--env", "CHIEF_SLEEP=600", "--",
                    "python", "stand_in.py")  # fmt: skip
    assert code == 0, out
    # The bucket answers 503 three times: the last pass takes seconds
    # (the client's backoff), which `down` must wait out.
    fake.fail(503, upload="multipart", times=3)
    code, out = run(config, "down", "--yes")
    assert code == 0, out
    assert fake.failures_left() == 0
    assert "a job is running: stopping it, then waiting for its upload" in out
    assert "waiting for 1 upload(s) to the bucket to finish" in out
    # What the chief had written is in the bucket once `down` returns.
    [record] = [n for n in fake.names("tfc-runs") if n.endswith("/tfcluster-run.json")]
    folder = record.rsplit("/", 1)[0]
    assert f"{folder}/chief-0.json" in fake.names("tfc-runs")
    assert json.loads(fake.read("tfc-runs", record))["status"] == "stopped"
    none_left_in(work)


def test_a_nodes_hostile_upload_state_cannot_keep_down_from_deleting(
    fake: FakeGcs, tmp_path: Path
) -> None:
    """An uploader's state file is the node's text: a count past what a
    float or an int holds (JSON's 1e999 is infinity) made `down` exit 70
    with a traceback, every node left running (and billed)."""
    fake.create_bucket("tfc-runs")
    config = write_config(tmp_path, fake)
    code, out = run(config, "up")
    assert code == 0, out
    logs = Path(os.environ["TFCLUSTER_HOME"]).rglob("nodes/pc-1")
    folder = next(logs) / "tfcluster" / "logs"
    folder.mkdir(parents=True)
    (folder / "upload-evil.json").write_text('{"uploaded": 1e999}')
    code, out = run(config, "down", "--yes")
    assert code == 0, out
    assert "deleted bkt" in out


def test_an_endpoint_that_never_answers_is_one_line_not_a_bug() -> None:
    """The client retries a refused connection until its deadline, then
    raises RetryError (neither an API error nor an OSError): `up`'s check,
    `runs`, `fetch` and `report` exited 70, "a bug in tfcluster", after 2
    minutes (an emulator not started, a firewall in the way)."""
    import socket

    from google.cloud.storage.retry import DEFAULT_RETRY

    from infra.bucket.client import errors
    from infra.errors import ProviderError
    from infra.storage.transfer import make_client

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nobody answers there
    client = make_client(f"http://127.0.0.1:{port}", "anonymous")
    with pytest.raises(ProviderError) as caught, errors("storage.bucket: gs://tfc-runs"):
        client.bucket("tfc-runs").test_iam_permissions(
            ["storage.objects.get"], retry=DEFAULT_RETRY.with_timeout(1.0)
        )
    line = str(caught.value)
    assert line.startswith("storage.bucket: gs://tfc-runs: ") and "\n" not in line
    assert "no answer from Cloud Storage (ConnectionRefusedError: [Errno 111] Connection" in line
    assert caught.value.hint is not None and "storage.endpoint" in caught.value.hint


def test_without_a_bucket_runs_says_so(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(yaml.safe_dump({"name": "plain", "provider": "local"}))
    code, out = run(config, "runs")
    assert code == 3, out
    assert "has no storage section: runs are only on the nodes" in out


def test_a_key_file_signs_in_and_is_named_when_it_may_not_write(
    fake: FakeGcs, tmp_path: Path
) -> None:
    email = "writer@proj.iam.gserviceaccount.com"
    (tmp_path / "writer.json").write_text(json.dumps(service_account_key(fake, email)))
    fake.create_bucket("tfc-runs", permissions={"storage.objects.list"})
    config = write_config(tmp_path, fake)
    data = yaml.safe_load(config.read_text())
    data["storage"]["credentials"] = "writer.json"
    config.write_text(yaml.safe_dump(data))
    code, out = run(config, "up")
    assert code == 2, out
    assert f"{email} may not write runs there" in out
    assert f"--member=serviceAccount:{email} --role=roles/storage.objectAdmin" in out
    assert fake.accounts() == {email}

    fake.buckets["tfc-runs"].permissions |= OBJECT_ADMIN
    work = tmp_path / "project"
    work.mkdir()
    shutil.copy(STAND_IN, work / "stand_in.py")
    data["job"] = {"workdir": str(work)}
    config.write_text(yaml.safe_dump(data))
    code, out = run(config, "run", "--no-ps", "--", "python", "stand_in.py")
    assert code == 0, out
    assert any(n.endswith("/chief-0.json") for n in fake.names("tfc-runs"))
    assert fake.accounts() == {email}  # the node's uploader signed in with the key too
    none_left_in(work)


def test_ctrl_c_skips_the_wait_and_says_what_is_not_in_the_bucket(
    fake: FakeGcs, tmp_path: Path, tfcluster_home: Path, deploy_popen: DeployPopen
) -> None:
    import signal
    import time

    fake.create_bucket("tfc-runs")
    work = tmp_path / "project"
    work.mkdir()
    shutil.copy(STAND_IN, work / "stand_in.py")
    config = write_config(tmp_path, fake, job={"workdir": str(work)})
    code, out = run(config, "run", "--no-ps", "--detach", "--env", "CHIEF_SLEEP=600", "--",
                    "python", "stand_in.py")  # fmt: skip
    assert code == 0, out
    # The uploader's first pass has listed the chief's file (on a loaded
    # machine it may not have run yet when `down` asks).
    logs = tfcluster_home / "clusters" / "bkt" / "nodes" / "pc-1" / "tfcluster" / "logs"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
        "chief-0.json" in f.read_text(errors="replace") for f in logs.glob("upload-*.json")
    ):
        time.sleep(0.2)
    fake.fail(503, times=100_000)  # the bucket is down from now on
    down = deploy_popen(config, "down", "--yes")
    assert down.stdout is not None
    seen = ""
    deadline = time.monotonic() + 120
    while "waiting for 1 upload(s)" not in seen and time.monotonic() < deadline:
        seen += down.stdout.readline()
    assert "waiting for 1 upload(s)" in seen, seen
    down.send_signal(signal.SIGINT)
    rest, _ = down.communicate(timeout=120)
    assert down.returncode == 0, seen + rest
    assert "not waiting for the uploads: not in the bucket: gs://tfc-runs/team/bkt/stand-in-" in rest
    assert "chief-0.json" in rest
    assert "deleted bkt" in rest
    none_left_in(work)


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_the_end_says_it_waits_for_the_upload_and_ctrl_c_keeps_the_outcome(
    fake: FakeGcs, tmp_path: Path, command: str, deploy_popen: DeployPopen
) -> None:
    """A job whose upload takes a while (a slow bucket: here the run's
    record at the end, 20 s): its end says that it waits, instead
    of minutes of silence after the chief's last line; and Ctrl-C then
    skips the wait, the job's own exit code and results kept (it exited
    130, "interrupted", the results line never said), the upload going on."""
    import signal
    import time

    fake.create_bucket("tfc-runs")
    work = tmp_path / "project"
    work.mkdir()
    shutil.copy(STAND_IN, work / "stand_in.py")
    config = write_config(tmp_path, fake, job={"workdir": str(work)})
    fake.slow(20, suffix="/tfcluster-run.json", after=1)  # the record at the end, not at the start
    args = (
        ["run", "--no-ps", "--", "python", "stand_in.py"]
        if command == "run"
        else ["sweep", "--param", "x=1", "--", "python", "-c", "print({x})"]
    )
    job = deploy_popen(config, *args)
    assert job.stdout is not None
    seen = ""
    deadline = time.monotonic() + 120
    while "waiting for the upload to gs://tfc-runs/team/bkt/" not in seen:
        assert time.monotonic() < deadline and job.poll() is None, seen
        seen += job.stdout.readline()
    assert "Ctrl-C skips the wait" in seen
    job.send_signal(signal.SIGINT)
    rest, _ = job.communicate(timeout=120)
    assert job.returncode == 0, seen + rest
    assert "not waiting for the upload to gs://tfc-runs/team/bkt/" in rest
    if command == "run":
        assert "still uploading" in rest and "results: runs/bkt/stand-in-" in rest
    # The upload went on: `down` waits for it, and it lands.
    code, out = run(config, "down", "--yes")
    assert code == 0, out
    landed = "/chief-0.json" if command == "run" else "/trial-0/tfcluster-run.json"
    assert any(n.endswith(landed) for n in fake.names("tfc-runs"))
    none_left_in(work)


def test_a_resume_while_the_last_upload_goes_on_is_uploaded_too(
    fake: FakeGcs,
    tmp_path: Path,
    mnist_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    deploy_popen: DeployPopen,
) -> None:
    """`train --resume` continues the same run id, whose uploader (same
    name) may still be busy: a slow bucket, its wait skipped with Ctrl-C
    as the job's end offers. The resumed job's uploader could not start
    ("already running"): its training never reached the bucket."""
    import signal
    import time

    monkeypatch.setenv("MNIST_DIR", str(mnist_dir))
    fake.create_bucket("tfc-runs")
    config = write_config(tmp_path, fake)
    # The run's record at its end is late: its uploader is busy a minute
    # after the job, past the next one's launch.
    fake.slow(60, suffix="/tfcluster-run.json", after=1)
    train = deploy_popen(config, "train", "--steps", "10")
    assert train.stdout is not None
    seen = ""
    deadline = time.monotonic() + 300
    while "waiting for the upload to" not in seen:
        assert time.monotonic() < deadline and train.poll() is None, seen
        seen += train.stdout.readline()
    train.send_signal(signal.SIGINT)
    rest, _ = train.communicate(timeout=120)
    assert train.returncode == 0, seen + rest
    code, out = run(config, "train", "--resume", "--steps", "20")
    assert code == 0, out
    assert "could not start the upload" not in out
    [summary] = [n for n in fake.names("tfc-runs") if n.endswith("/summary.json")]
    assert json.loads(fake.read("tfc-runs", summary))["steps"] == 20

