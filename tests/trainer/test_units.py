"""Unit tests of the trainer's parts: patch windows and stitching, TF_CONFIG
parsing, MNIST checksums, the progress protocol, flags and call planning."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from infra.jobs.progress import parse_line
from infra.spec.tfconfig import TaskSpec, build_tasks, tf_config_json
from tests.trainer.cluster import REPO, task_env
from trainer import catalog
from trainer.data import mnist as data
from trainer.data import patches
from trainer.distribution import strategy as distribute
from trainer.errors import ClusterError, DataError
from trainer.flags import parse_args
from trainer.loop.progress import Progress, Startup, format_event

# -- patch windows -----------------------------------------------------------


def test_window_starts_cover_the_image_and_end_flush() -> None:
    assert patches.starts(28, 8, 4).tolist() == [0, 4, 8, 12, 16, 20]
    # 28 - 10 = 18 is not on the stride: a last window flush with the edge.
    assert patches.starts(28, 10, 4).tolist() == [0, 4, 8, 12, 16, 18]
    assert patches.starts(28, 28, 4).tolist() == [0]
    corners = patches.windows(28, 28, 10, 4)
    assert corners.shape == (36, 2)
    assert corners[0].tolist() == [0, 0] and corners[-1].tolist() == [18, 18]


def test_stitching_the_patches_of_an_image_gives_it_back() -> None:
    rng = np.random.default_rng(0)
    images = rng.random((3, 28, 28)).astype(np.float32)
    corners = patches.windows(28, 28, 10, 4)
    stitched = patches.stitch(patches.extract(images, corners, 10), corners, 28, 28)
    np.testing.assert_allclose(stitched, images, rtol=0, atol=1e-6)


def test_stitching_averages_overlapping_pixels_exactly() -> None:
    corners = patches.windows(6, 6, 4, 2)  # starts 0, 2 per axis: 4 windows
    assert corners.tolist() == [[0, 0], [0, 2], [2, 0], [2, 2]]
    # Patch m is filled with the value m: a pixel becomes the mean of the ids
    # of the windows that cover it.
    filled = np.stack([np.full((4, 4), m, np.float64) for m in range(4)])[None]
    image = patches.stitch(filled, corners, 6, 6)[0]
    assert image[0, 0] == 0  # window 0 only
    assert image[0, 5] == 1  # window 1 only
    assert image[0, 2] == 0.5  # windows 0 and 1
    assert image[2, 0] == 1.0  # windows 0 and 2
    assert image[3, 3] == 1.5  # all four
    assert image[5, 5] == 3


def test_cut_gathers_the_same_patches_as_numpy() -> None:
    import tensorflow as tf

    rng = np.random.default_rng(1)
    images = rng.integers(0, 255, (5, 28, 28), dtype=np.uint8)
    corners = patches.windows(28, 28, 8, 4)
    image_index = np.array([0, 4, 2, 2])
    chosen = corners[[0, 35, 7, 20]]
    cut = patches.cut(tf.constant(images), tf.constant(image_index), tf.constant(chosen), 8)
    expected = [
        images[i, y : y + 8, x : x + 8] for i, (y, x) in zip(image_index, chosen, strict=True)
    ]
    np.testing.assert_array_equal(cut.numpy(), np.stack(expected))


def test_index_stream_is_a_permutation_per_epoch_and_resumable() -> None:
    from trainer.data.inputs import index_batches, stream_key

    def take(start: int, count: int, pipeline: int) -> np.ndarray:
        stream = index_batches(12, 4, start, stream_key(7, pipeline))
        return np.stack([b["index"].numpy() for b in stream.take(count)])

    epochs = take(0, 6, 0).reshape(2, 12)  # 6 batches of 4 = two epochs of 12
    for epoch in epochs:
        assert sorted(epoch.tolist()) == list(range(12))
    assert epochs[0].tolist() != epochs[1].tolist()  # reshuffled per epoch
    assert take(0, 3, 1).tolist() != take(0, 3, 0).tolist()  # per-worker order
    np.testing.assert_array_equal(take(4, 2, 0), take(0, 6, 0)[4:])  # resume = continue



WORKER_STREAM = """
import keras, tensorflow as tf
from trainer.data.inputs import index_batches, worker_stream_key
keras.utils.set_random_seed(1)  # as every task of a job does
first = tf.function(
    lambda: next(iter(index_batches(8000, 8, 0, worker_stream_key(1, salt=0))))["index"]
)
print(first().numpy().tolist())
"""


def test_async_workers_running_one_traced_dataset_draw_different_streams() -> None:
    # ClusterCoordinator runs one traced dataset graph on every worker: two
    # processes running the same program stand in for two workers.
    def first_batch() -> str:
        done = subprocess.run(
            [sys.executable, "-c", WORKER_STREAM], cwd=REPO, capture_output=True, text=True,
            timeout=120, check=True,
        )  # fmt: skip
        return done.stdout.strip().splitlines()[-1]

    a, b = first_batch(), first_batch()
    assert a != b, "two workers would train on the same batches"


# -- TF_CONFIG ---------------------------------------------------------------

ADDRESSES = {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3", "d": "10.0.0.4"}
PORTS = {"ps": 2222, "worker": 2223, "chief": 2224}


def _tasks(mode: str) -> list[TaskSpec]:
    roles = {"ps": ["a"], "chief": ["a"], "worker": ["b", "c", "d"]}
    return build_tasks(catalog.mode(mode).task_types, roles, ADDRESSES, lambda node, t, i: PORTS[t])


def test_tf_config_of_an_async_job() -> None:
    tasks = _tasks("async")
    chief = distribute.parse_tf_config(tf_config_json(tasks, tasks[-1]))
    assert chief.is_chief and chief.task_type == "chief"
    assert chief.num_ps == 1 and distribute.num_workers(chief, "async") == 3
    distribute.check_mode(chief, "async")
    worker = distribute.parse_tf_config(tf_config_json(tasks, tasks[2]))
    assert (worker.task_type, worker.task_index, worker.is_chief) == ("worker", 1, False)
    assert distribute.serves_only(worker, "async") and not distribute.serves_only(chief, "async")
    with pytest.raises(ClusterError, match="must not list a ps"):
        distribute.check_mode(chief, "sync")


def test_tf_config_of_a_collective_job() -> None:
    tasks = _tasks("sync")
    infos = [distribute.parse_tf_config(tf_config_json(tasks, t)) for t in tasks]
    assert [i.name for i in infos] == ["worker-0", "worker-1", "worker-2", "chief-0"]
    assert [distribute.worker_index(i) for i in infos] == [1, 2, 3, 0]
    assert distribute.num_workers(infos[0], "sync") == 4
    assert [i.is_chief for i in infos] == [False, False, False, True]
    # Who says goodbye to whom at the end (collectives.leave_together).
    assert {i.chief_name for i in infos} == {"chief-0"}
    assert infos[0].training_tasks() == ["chief-0", "worker-0", "worker-1", "worker-2"]
    distribute.check_mode(infos[0], "average")
    with pytest.raises(ClusterError, match="needs ps"):
        distribute.check_mode(infos[0], "async")


def test_no_tf_config_is_a_single_chief() -> None:
    info = distribute.parse_tf_config(None)
    assert info.is_chief and not info.cluster and distribute.num_workers(info, "sync") == 1
    with pytest.raises(ClusterError, match="async needs TF_CONFIG"):
        distribute.check_mode(info, "async")
    # A cluster without a chief: worker 0 is the chief (TF's rule).
    only_workers = json.dumps(
        {"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 0}}
    )
    assert distribute.parse_tf_config(only_workers).is_chief
    assert distribute.parse_tf_config(only_workers).chief_name == "worker-0"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        (
            '{"cluster": {"evaluator": ["h:1"]}, "task": {"type": "evaluator"}}',
            "task type 'evaluator'",
        ),
        (
            '{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 3}}',
            "index 3 out of range",
        ),
        (
            '{"cluster": {"worker": ["h:1"]}, "task": {"type": "ps", "index": 0}}',
            "not in its cluster",
        ),
    ],
)
def test_bad_tf_config_is_a_cluster_error(text: str, message: str) -> None:
    with pytest.raises(ClusterError, match=message):
        distribute.parse_tf_config(text)


# -- MNIST files and checksums -----------------------------------------------


@pytest.fixture
def mnist_copy(tmp_path: Path, mnist_dir: Path) -> Path:
    copy = tmp_path / "mnist"
    shutil.copytree(mnist_dir, copy)
    for f in copy.iterdir():
        f.chmod(0o644)
    return copy


def test_offline_copy_verifies_and_loads(mnist_copy: Path) -> None:
    assert data.resolve_data_dir(str(mnist_copy)) == mnist_copy.resolve()
    train = data.load_split(mnist_copy, "train")
    assert train.images.shape == (8000, 28, 28) and train.labels.max() == 9
    assert data.count_examples(mnist_copy, "test") == 2000


def test_corrupted_file_is_rejected_by_its_checksum(mnist_copy: Path) -> None:
    target = mnist_copy / "t10k-labels-idx1-ubyte.gz"
    raw = bytearray(target.read_bytes())
    raw[-20] ^= 0xFF
    target.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte.gz is corrupted: SHA-256"):
        data.resolve_data_dir(str(mnist_copy))


def test_truncated_idx_file_is_rejected_by_its_header(mnist_copy: Path) -> None:
    (mnist_copy / "SHA256SUMS").unlink()
    target = mnist_copy / "t10k-images-idx3-ubyte.gz"
    with gzip.open(target) as f:
        raw = f.read()
    target.write_bytes(gzip.compress(raw[:-100]))
    with pytest.raises(DataError, match="truncated"):
        data.load_split(mnist_copy, "test")


def test_download_keeps_only_files_with_the_expected_checksum(
    tmp_path: Path, mnist_dir: Path
) -> None:
    sums = data.parse_sums((mnist_dir / "SHA256SUMS").read_text())
    mirror = mnist_dir.as_uri() + "/"
    cache = tmp_path / "cache"
    data.download(cache, ["t10k-labels-idx1-ubyte.gz"], base_url=mirror, checksums=sums)
    assert data.sha256_of(cache / "t10k-labels-idx1-ubyte.gz") == sums["t10k-labels-idx1-ubyte.gz"]
    # The official checksum does not match this subset: rejected, nothing kept.
    with pytest.raises(DataError, match=r"downloaded .*train-labels-idx1-ubyte.gz is corrupted"):
        data.download(cache, ["train-labels-idx1-ubyte.gz"], base_url=mirror)
    assert sorted(p.name for p in cache.iterdir()) == ["t10k-labels-idx1-ubyte.gz"]


def test_offline_download_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"cannot download .*offline"):
        data.download(tmp_path, ["t10k-labels-idx1-ubyte.gz"], base_url="http://127.0.0.1:9/")


def test_missing_data_fails_with_one_line_and_exit_code_4(tmp_path: Path) -> None:
    env = task_env(
        {
            "TFCLUSTER_CACHE": str(tmp_path / "cache"),
            "TFCLUSTER_MNIST_MIRROR": "http://127.0.0.1:9/",
        }
    )
    env.pop("MNIST_DIR", None)
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "--output-dir", str(tmp_path / "run")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 4
    assert result.stderr.splitlines()[-1].startswith("trainer: error: cannot download")
    assert "Traceback" not in result.stderr
    events = [parse_line(line) for line in result.stdout.splitlines()]
    assert [e.kind for e in events if e] == ["error"]


def test_mode_that_does_not_fit_tf_config_exits_3(tmp_path: Path, mnist_dir: Path) -> None:
    env = task_env({"MNIST_DIR": str(mnist_dir)})
    env.pop("TF_CONFIG", None)
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "--mode", "async"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3
    assert result.stderr.strip() == (
        "trainer: error: mode async needs TF_CONFIG with a chief, a ps and workers"
    )


# -- flags ---------------------------------------------------------------------


def test_flag_defaults_and_model_learning_rates() -> None:
    config = parse_args([])
    assert (config.model, config.mode, config.steps, config.batch_size) == (
        "cnn",
        "single",
        600,
        128,
    )
    assert config.eval and config.output_dir.startswith("runs/")
    assert parse_args(["--model", "dae", "--no-eval"]).learning_rate == 3e-3
    assert parse_args(["--epochs", "2"]).steps is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "nope"],
        ["--steps", "0"],
        ["--steps", "5", "--epochs", "1"],
        ["--patch", "8", "--stride", "9"],
        ["--model", "sdae", "--steps", "100", "--pretrain-steps", "50"],
    ],
)
def test_bad_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2


# -- progress protocol ------------------------------------------------------


def test_progress_lines_are_one_json_object_each_after_the_prefix() -> None:
    out = io.StringIO()
    progress = Progress(out)
    progress.start(
        model="cnn",
        mode="async",
        total_steps=600,
        workers=2,
        ps=1,
        output_dir="runs/x",
        resumed_from_step=0,
    )
    progress.progress(
        step=20,
        total_steps=600,
        loss=float("nan"),
        metrics={"accuracy": 0.5},
        examples_per_sec=100.0,
        steps_per_sec=1.5,
        elapsed=3.0,
        eta=40.0,
    )
    progress.phase("pretrain-layer-1")
    progress.checkpoint(100, "runs/x/checkpoints/ckpt-100")
    progress.done({"steps": 600, "test_accuracy": 0.98})
    progress.error("boom")
    Progress(out, enabled=False).error("not the chief: silent")
    lines = out.getvalue().splitlines()
    assert all(line.startswith('@tfcluster {"event":') for line in lines)
    events = [parse_line(line) for line in lines]
    assert [e.kind for e in events if e] == [
        "start",
        "progress",
        "phase",
        "checkpoint",
        "done",
        "error",
    ]
    progress_event = events[1]
    assert progress_event is not None
    assert progress_event.data == {
        "step": 20,
        "total_steps": 600,
        "loss": None,
        "metrics": {"accuracy": 0.5},
        "examples_per_sec": 100.0,
        "steps_per_sec": 1.5,
        "elapsed": 3.0,
        "eta": 40.0,
    }  # NaN travels as null: strict JSON
    assert json.loads(lines[0].removeprefix("@tfcluster ")) == {
        "event": "start",
        "model": "cnn",
        "mode": "async",
        "total_steps": 600,
        "workers": 2,
        "ps": 1,
        "output_dir": "runs/x",
        "resumed_from_step": 0,
    }
    assert (
        format_event("done", {"summary": {"x": 1}})
        == '@tfcluster {"event":"done","summary":{"x":1}}'
    )


def test_startup_stages_from_the_orchestrator_and_the_chief() -> None:
    """What the orchestrator told the chief (TFCLUSTER_STARTUP), then the
    chief's stages: each said once as it ends, all in summary.json's
    ``startup_s`` with their sum."""
    out = io.StringIO()
    issued = time.time() - 0.5  # the start was issued half a second ago
    told = json.dumps({"command": 0.4, "sync": 1.5, "start_tasks": 0.25, "issued": issued})
    startup = Startup(Progress(out), told)
    startup.mark("tensorflow")
    startup.first_step()
    startup.first_step()  # later results: the start-up is over, nothing more
    startup.mark("build")
    events = [parse_line(line) for line in out.getvalue().splitlines()]
    assert [(e.kind, e.get("stage")) for e in events if e] == [
        ("startup", "tensorflow"),
        ("startup", "first_step"),
    ]
    summary = startup.summary()
    assert set(summary) == {
        "command", "sync", "start_tasks", "launch", "tensorflow", "first_step", "total",
    }  # fmt: skip
    assert (summary["command"], summary["sync"], summary["start_tasks"]) == (0.4, 1.5, 0.25)
    # Issued before this process (pytest) began: nothing left to wait for.
    assert summary["launch"] == 0.0
    parts = sum(v for k, v in summary.items() if k != "total")
    assert summary["total"] == pytest.approx(parts, abs=0.005)
    first = events[1]
    assert first is not None and first.get("total") == pytest.approx(summary["total"], abs=0.01)


@pytest.mark.parametrize(
    "told",
    ["", "not json", "[1, 2]", '{"sync": -3, "command": "x", "issued": "later"}',
     '{"sync": 1e999, "start_tasks": NaN}'],
)  # fmt: skip
def test_startup_ignores_what_it_cannot_use(told: str) -> None:
    startup = Startup(Progress(io.StringIO()), told)
    startup.first_step()
    assert set(startup.summary()) == {"first_step", "total"}


def test_a_serving_task_imports_the_server_alone() -> None:
    """A ps or worker gets TensorFlow's gRPC server without the rest of its
    Python API (nor Keras, nor matplotlib), and the server serves."""
    probe = """
import socket, sys
from trainer.distribution import strategy as distribute
server_lib = distribute.server_module()
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
spec = server_lib.ClusterSpec({"ps": [f"127.0.0.1:{port}"]})
server = server_lib.Server(spec, job_name="ps", task_index=0, protocol="grpc", start=True)
socket.create_connection(("127.0.0.1", port), timeout=5).close()
tf = sys.modules["tensorflow"]
print(hasattr(tf, "distribute"), "keras" in sys.modules, "matplotlib" in sys.modules)
"""
    assert probe_words(probe) == ["False", "False", "False"]


def probe_words(code: str) -> list[str]:
    """What ``code`` prints, word by word, run by a fresh trainer Python."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env=task_env(),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_chiefs_tensorflow_comes_without_matplotlib_which_the_plots_load_later(
    tmp_path: Path,
) -> None:
    """The chief's TensorFlow import leaves matplotlib out (Keras would
    import it for plotting functions the trainer never calls); the import
    works as usual afterwards, from the background warm-up and for the
    plots at the end."""
    probe = f"""
import sys
from pathlib import Path
from trainer.imports import import_tensorflow, kept_out
tf = import_tensorflow()
import keras
print(hasattr(tf, "distribute"), "keras" in sys.modules, "matplotlib" in sys.modules)
with kept_out(("json",)):  # already imported: left alone
    import json
from trainer.loop import outputs
outputs.preload_plotting()  # the plot waits for it
lines = [{{"step": s, "loss": 1.0 / s, "accuracy": 0.5}} for s in (1, 2)]
outputs.plot_loss(lines, Path({str(tmp_path)!r}) / "loss.png", "t", {{"test_accuracy": 0.5}})
print("matplotlib.pyplot" in sys.modules, len(outputs._pyplot().get_fignums()))
"""
    # ... and every figure drawn was closed (the warm-up's too).
    assert probe_words(probe) == ["True", "True", "False", "True", "0"]
    assert (tmp_path / "loss.png").read_bytes().startswith(b"\x89PNG")


def test_kept_out_refuses_a_module_only_inside_the_block() -> None:
    from trainer.imports import kept_out

    name = "tfcluster_never_imported_module"
    with kept_out((name,)), pytest.raises(ImportError):
        __import__(name)
    assert name not in sys.modules  # importable again (it simply does not exist here)
    with pytest.raises(ModuleNotFoundError, match="No module named"):
        __import__(name)


def test_async_chief_waits_for_its_servers_to_listen() -> None:
    """Real sockets: the wait ends once every ps and worker port accepts,
    and names those that never do."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: refuses
    refused = closed.getsockname()[1]
    cluster = {"chief": (f"127.0.0.1:{refused}",), "ps": (f"127.0.0.1:{port}",),
               "worker": (f"127.0.0.1:{port}",)}  # fmt: skip
    info = distribute.ClusterInfo(cluster=cluster, task_type="chief", task_index=0)
    timer = threading.Timer(0.3, listener.listen)
    timer.start()
    try:
        distribute.wait_for_servers(info, 30.0)  # only ps and workers: not the chief
        gone = {"ps": (f"127.0.0.1:{refused}",), "worker": (f"127.0.0.1:{port}",)}
        with pytest.raises(ClusterError, match=f"127.0.0.1:{refused} did not listen within 1 s"):
            distribute.wait_for_servers(distribute.ClusterInfo(cluster=gone), 1.0)
    finally:
        timer.cancel()
        listener.close()
        closed.close()


# -- call planning -------------------------------------------------------------


def test_calls_end_on_every_log_checkpoint_and_average_point() -> None:
    from trainer.loop.loops import plan_calls

    assert plan_calls(0, 25, 10, [20]) == [10, 10, 5]
    assert plan_calls(0, 25, 10, [7]) == [7, 7, 7, 4]
    assert plan_calls(0, 25, 5, [7]) == [5, 2, 5, 2, 5, 2, 4]
    assert plan_calls(15, 40, 100, [20, 30]) == [5, 10, 10]
    assert plan_calls(40, 40, 10, [20]) == []


def test_the_first_call_of_a_run_is_one_step() -> None:
    """Its result ends the start-up: one step in, whatever --steps-per-call."""
    from trainer.loop.loops import first_step_alone, plan_calls

    assert first_step_alone(plan_calls(0, 25, 10, [20])) == [1, 9, 10, 5]
    assert first_step_alone([1, 10]) == [1, 10]
    assert first_step_alone([]) == []
    assert sum(plan_calls(3, 1000, 16, [50, 100, 7])) == 997
