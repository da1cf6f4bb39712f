"""The trainer on this machine's GPUs against plain Keras ``fit``, in one run.

For the convnet and the CNN, with mixed precision and XLA each off and on,
one after the other on this machine:

* plain Keras ``fit`` of the same architecture (Keras' own Dropout, the
  same Adam, the same per-GPU batch; MirroredStrategy where there are
  several GPUs, so that it uses the devices the trainer uses);
* ``python -m trainer --mode single`` (MirroredStrategy over every local GPU);
* ``python -m trainer --mode sync`` (MultiWorkerMirroredStrategy): one task
  per GPU, each seeing only its own (``CUDA_VISIBLE_DEVICES``), as tasks on
  separate one-GPU nodes would; one task where there is one GPU.

Measured per set-up: steady examples/s (the first log interval, with the
tracing and compiling, left out, for Keras too), the peak GPU memory
TensorFlow's allocator held (``tf.config.experimental.get_memory_info``,
summed over the GPUs) and the mean GPU utilisation nvidia-smi reported while
it ran (sampled twice a second). For the CNN also the training time to
``--target`` (98.5 %) accuracy on the offline MNIST test set: Keras
evaluates after every ``--eval-every`` steps outside its timed steps and
stops at the target; the trainer keeps a checkpoint every ``--eval-every``
steps (their saving counts in its time), each evaluated after the run, and
its time is the run's elapsed training time at the first checkpoint that
reaches the target.

Every set-up runs in processes of its own (a fresh TensorFlow, no memory
held from the one before). Ratios are against Keras ``fit`` of the same
model and settings, measured in the same run. Goals on an H100 (issue 16):
the convnet in ``single`` at 20,000 examples/s or more, the CNN at 98.5 % in
under 20 s of training, the trainer within 5 % of Keras ``fit``.

Without a GPU it says so in one line and exits 0. ``--cpu-smoke`` runs a
tiny version on the CPU (the CNN, a few steps, a low target) to show that
every part of the script works; its figures mean nothing.

Usage: ``python bench/gpu.py [--models cnn,convnet] [--precision off,on]
[--xla off,on] [--steps N] [--json-only]`` (MNIST from --data-dir or
$MNIST_DIR, as for the trainer).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infra.node import facts, probes  # noqa: E402  (no TensorFlow: the parent stays light)

MODELS = ("convnet", "cnn")
# Per-GPU batches: the source material's convnet ran 1024 per GPU.
BATCH = {"convnet": 1024, "cnn": 256}
TARGET_MODEL = "cnn"
CHILD_TIMEOUT_S = 3600
# The code run in each TensorFlow.
CHILDREN = Path(__file__).parent / "support" / "gpu_children.py"


@dataclass(frozen=True)
class Setting:
    model: str
    mixed: bool
    xla: bool

    @property
    def name(self) -> str:
        return f"{self.model} mp={'on' if self.mixed else 'off'} xla={'on' if self.xla else 'off'}"


@dataclass(frozen=True)
class Sizes:
    batch: dict[str, int]
    steps: int  # throughput runs
    warmup: int  # steps left out of throughput (and the trainer's first log interval)
    target: float
    eval_every: int
    max_steps: int  # time-to-accuracy runs give up here
    target_modes: tuple[str, ...] = ("single", "sync")  # trainer modes timed to the target


# -- child processes (each its own TensorFlow: bench/support/gpu_children.py) ----------------------


def child_env(cpu: bool, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"})
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # --cpu-smoke stays on the CPU on a GPU machine too
    env.update(extra)
    return env


def run_child(kind: str, spec: dict[str, Any], cpu: bool) -> dict[str, Any]:
    """Run ``bench/support/gpu_children.py KIND SPEC`` and return the JSON of its last line."""
    out = subprocess.run(
        [sys.executable, str(CHILDREN), kind, json.dumps(spec)],
        env=child_env(cpu),
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{kind} child failed ({out.returncode}):\n{out.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# -- the trainer's jobs ------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def run_trainer(
    mode: str, setting: Setting, argv: list[str], output: Path, gpus: int, cpu: bool
) -> dict[str, Any]:
    """One job of real trainer processes; the chief's summary.json."""
    flags = [
        "--model", setting.model, "--mode", mode, "--output-dir", str(output), "--no-eval",
        *(["--mixed-precision"] if setting.mixed else []), *(["--xla"] if setting.xla else []),
        *([] if cpu else ["--require-gpu"]), *argv,
    ]  # fmt: skip
    tasks = max(1, gpus) if mode == "sync" else 1
    names = ["chief", *(["worker"] * (tasks - 1))]
    addresses = [f"localhost:{p}" for p in free_ports(tasks)]
    cluster = {"chief": addresses[:1], **({"worker": addresses[1:]} if tasks > 1 else {})}
    processes = []
    output.mkdir(parents=True, exist_ok=True)
    try:
        for i, kind in enumerate(names):
            extra = {}
            if mode == "sync":
                index = 0 if kind == "chief" else i - 1
                extra["TF_CONFIG"] = json.dumps(
                    {"cluster": cluster, "task": {"type": kind, "index": index}}
                )
                if tasks > 1:
                    extra["CUDA_VISIBLE_DEVICES"] = str(i)
            log = (output.parent / f"{output.name}-{kind}-{i}.log").open("w")
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "trainer", *flags],
                    cwd=REPO,
                    env=child_env(cpu, **extra),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        codes = [p.wait(timeout=CHILD_TIMEOUT_S) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        logs = (output.parent / f"{output.name}-chief-0.log").read_text()[-4000:]
        raise RuntimeError(f"trainer {mode} {setting.name} exited {codes}:\n{logs}")
    summary: dict[str, Any] = json.loads((output / "summary.json").read_text())
    return summary


def elapsed_by_step(output: Path) -> dict[int, float]:
    lines = (output / "metrics.jsonl").read_text().splitlines()
    return {int(x["step"]): float(x["elapsed"]) for x in map(json.loads, lines) if "elapsed" in x}


# -- GPU utilisation -------------------------------------------------------------


class Utilisation:
    """Mean utilisation over every GPU while a set-up runs, from nvidia-smi
    (``infra/node/probes.py``, the query ``deploy.py status`` uses)."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            out = subprocess.run(
                ["bash", "-c", probes.gpu_query()], capture_output=True, text=True, timeout=30
            )
            report = facts.parse_gpus(out.stdout)
            self.samples += [g.utilization for g in report.gpus if g.utilization is not None]

    def __enter__(self) -> Utilisation:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float | None:
        return statistics.mean(self.samples) if self.samples else None


# -- the benchmark ----------------------------------------------------------------


def gib(peaks: dict[str, int] | None) -> float | None:
    return sum(peaks.values()) / 2**30 if peaks else None


@dataclass(frozen=True)
class Run:
    """What every set-up of one benchmark run shares."""

    sizes: Sizes
    data_dir: str
    gpus: int
    cpu: bool
    root: Path  # the trainer's output folders


def bench(settings: list[Setting], run: Run) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for setting in settings:
        keras = keras_row(setting, run)
        rows.append(keras)
        for mode in ("single", "sync"):
            rows.append(trainer_row(setting, mode, run, keras["examples_per_sec"]))
    return rows


def keras_row(setting: Setting, run: Run) -> dict[str, Any]:
    """Keras fit's throughput and (for the target model) time to the target."""
    sizes = run.sizes
    batch = sizes.batch[setting.model]
    spec = {
        "model": setting.model, "mixed": setting.mixed, "xla": setting.xla,
        "batch_size": batch, "steps": sizes.steps, "warmup": sizes.warmup,
        "data_dir": run.data_dir, "eval_every": sizes.eval_every, "max_steps": sizes.max_steps,
        "target": sizes.target if setting.model == TARGET_MODEL else None,
    }  # fmt: skip
    print(f"bench: {setting.name}: keras fit", file=sys.stderr, flush=True)
    with Utilisation() as util:
        keras = run_child("keras", spec, run.cpu)
    return {
        "setup": "keras_fit", **asdict(setting), "batch_per_gpu": batch,
        "examples_per_sec": keras["examples_per_sec"], "vs_keras_fit": 1.0,
        "gpu_memory_peak_gib": gib(keras["gpu_memory_peak_bytes"]),
        "gpu_utilisation": util.mean,
        "seconds_to_target": (keras.get("to_target") or {}).get("seconds"),
        "steps_to_target": (keras.get("to_target") or {}).get("steps"),
    }  # fmt: skip


def trainer_row(setting: Setting, mode: str, run: Run, keras_speed: float) -> dict[str, Any]:
    """The trainer's throughput in ``mode`` against Keras fit's, and (for the
    target model in a target mode) its time to the target."""
    sizes = run.sizes
    batch = sizes.batch[setting.model]
    name = f"{setting.model}-{mode}-mp{int(setting.mixed)}-xla{int(setting.xla)}"
    print(f"bench: {setting.name}: trainer {mode}", file=sys.stderr, flush=True)
    with Utilisation() as util:
        summary = run_trainer(
            mode, setting,
            ["--steps", str(sizes.steps), "--batch-size", str(batch),
             "--log-every", str(sizes.warmup), "--checkpoint-every", "0",
             "--data-dir", run.data_dir],
            run.root / name, run.gpus, run.cpu,
        )  # fmt: skip
    row = {
        "setup": f"trainer_{mode}", **asdict(setting), "batch_per_gpu": batch,
        "examples_per_sec": summary["steady_examples_per_sec"],
        "vs_keras_fit": summary["steady_examples_per_sec"] / keras_speed,
        "gpu_memory_peak_gib": gib(summary.get("gpu_memory_peak_bytes")),
        "gpu_utilisation": util.mean,
        "devices": summary.get("devices"),
        "seconds_to_target": None, "steps_to_target": None,
    }  # fmt: skip
    if setting.model == TARGET_MODEL and mode in sizes.target_modes:
        row.update(trainer_to_target(setting, mode, run, run.root / f"{name}-target"))
    return row


def trainer_to_target(setting: Setting, mode: str, run: Run, output: Path) -> dict[str, Any]:
    """A trainer run that keeps a checkpoint every ``eval_every`` steps, each
    evaluated after it: the steps and elapsed training time at the first that
    reaches the target (none if none does), and the last one's accuracy."""
    sizes = run.sizes
    print(f"bench: {setting.name}: trainer {mode} to target", file=sys.stderr)
    run_trainer(
        mode, setting,
        ["--steps", str(sizes.max_steps), "--batch-size", str(sizes.batch[setting.model]),
         "--log-every", str(sizes.eval_every),
         "--checkpoint-every", str(sizes.eval_every), "--keep-checkpoints", "0",
         "--data-dir", run.data_dir],
        output, run.gpus, run.cpu,
    )  # fmt: skip
    spec = {"model": setting.model, "data_dir": run.data_dir,
            "checkpoints": str(output / "checkpoints")}  # fmt: skip
    accuracy = {int(k): v for k, v in run_child("eval", spec, run.cpu)["accuracy"].items()}
    elapsed = elapsed_by_step(output)
    reached = sorted(s for s, a in accuracy.items() if a >= sizes.target)
    found: dict[str, Any] = {}
    if reached:
        found["steps_to_target"] = reached[0]
        found["seconds_to_target"] = elapsed[reached[0]]
    found["last_accuracy"] = accuracy[max(accuracy)]
    return found


def goals(rows: list[dict[str, Any]], target: float) -> dict[str, bool | None]:
    """Issue 16's goals (meant for an H100), from this run's rows."""

    def best(setup: str, model: str, key: str, pick: Any = max) -> Any:
        values = [r[key] for r in rows if r["setup"] == setup and r["model"] == model]
        values = [v for v in values if v is not None]
        return pick(values) if values else None

    convnet = best("trainer_single", "convnet", "examples_per_sec")
    to_target = best("trainer_single", "cnn", "seconds_to_target", min)
    ratios = [r["vs_keras_fit"] for r in rows if r["setup"] == "trainer_single"]
    return {
        "convnet single >= 20000 examples/s": None if convnet is None else convnet >= 20000,
        f"cnn {target:.1%} in < 20 s": None if to_target is None else to_target < 20,
        "trainer single >= 0.95x keras fit (every setting)": (
            min(ratios) >= 0.95 if ratios else None
        ),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    def fmt(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    print(
        f"{'set-up':<16}{'model':<9}{'mp':<4}{'xla':<5}{'examples/s':>11}{'vs fit':>8}"
        f"{'mem GiB':>9}{'util %':>8}{'to target s':>13}{'steps':>7}"
    )
    for r in rows:
        print(
            f"{r['setup']:<16}{r['model']:<9}{'on' if r['mixed'] else 'off':<4}"
            f"{'on' if r['xla'] else 'off':<5}{r['examples_per_sec']:>11.0f}"
            f"{r['vs_keras_fit']:>7.2f}x{fmt(r['gpu_memory_peak_gib'], '.2f'):>9}"
            f"{fmt(r['gpu_utilisation'], '.0f'):>8}{fmt(r['seconds_to_target'], '.1f'):>13}"
            f"{fmt(r['steps_to_target'], 'd'):>7}"
        )


def on_off(text: str) -> list[bool]:
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words or any(w not in ("off", "on") for w in words):
        raise argparse.ArgumentTypeError(f"expected off, on or off,on; got {text!r}")
    return [w == "on" for w in words]


def model_list(text: str) -> list[str]:
    names = [w.strip() for w in text.split(",") if w.strip()]
    if not names or any(n not in MODELS for n in names):
        raise argparse.ArgumentTypeError(f"expected models among {', '.join(MODELS)}; got {text!r}")
    return names


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=model_list, default=list(MODELS))
    parser.add_argument("--precision", type=on_off, default=[False, True], help="off,on")
    parser.add_argument("--xla", type=on_off, default=[False, True], help="off,on")
    parser.add_argument("--steps", type=int, default=300, help="steps of each throughput run")
    parser.add_argument("--warmup", type=int, default=50, help="steps left out of throughput")
    parser.add_argument("--target", type=float, default=0.985, help="CNN test accuracy")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--max-steps", type=int, default=3000, help="of time-to-target runs")
    parser.add_argument("--data-dir", default=os.environ.get("MNIST_DIR"))
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="a tiny run on the CPU that exercises every part (its figures mean nothing)",
    )
    return parser


@dataclass(frozen=True)
class Plan:
    settings: list[Setting]
    sizes: Sizes
    gpus: int
    device: str  # in words, for the report


def smoke_plan() -> Plan:
    sizes = Sizes({"cnn": 16, "convnet": 16}, steps=6, warmup=3, target=0.3,
                  eval_every=10, max_steps=20, target_modes=("single",))  # fmt: skip
    settings = [Setting("cnn", mixed=False, xla=False)]
    return Plan(settings, sizes, 0, "CPU (smoke run: figures mean nothing)")


def gpu_plan(args: argparse.Namespace) -> Plan | None:
    """Every setting asked for on this machine's GPUs; None (said in one line)
    where TensorFlow sees no GPU."""
    probe = run_child("probe", {}, cpu=False)
    if not probe["gpus"]:
        built = "with CUDA" if probe["cuda"] else "without CUDA"
        print(
            f"bench/gpu.py: no GPU here (TensorFlow {probe['tf']} {built} sees none); "
            "nothing measured (--cpu-smoke runs a tiny CPU version)"
        )
        return None
    settings = [Setting(m, p, x) for m in args.models for p in args.precision for x in args.xla]
    sizes = Sizes(BATCH, args.steps, args.warmup, args.target, args.eval_every, args.max_steps)
    gpus = len(probe["gpus"])
    return Plan(settings, sizes, gpus, f"{gpus} x {probe['gpus'][0]}, TensorFlow {probe['tf']}")


def main() -> int:
    parser = arguments()
    args = parser.parse_args()
    if args.cpu_smoke:
        plan: Plan | None = smoke_plan()
    else:
        if args.steps <= 2 * args.warmup:
            parser.error(f"--steps must be above twice --warmup ({2 * args.warmup})")
        plan = gpu_plan(args)
    if plan is None:
        return 0
    from trainer.data.mnist import resolve_data_dir

    data_dir = str(resolve_data_dir(args.data_dir))  # downloads once, before timing
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        run = Run(plan.sizes, data_dir, plan.gpus, args.cpu_smoke, Path(tmp))
        rows = bench(plan.settings, run)
    report = {
        "device": plan.device,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "sizes": asdict(plan.sizes),
        "results": rows,
        "goals": None if args.cpu_smoke else goals(rows, plan.sizes.target),
    }
    if not args.json_only:
        print(f"bench/gpu.py on {plan.device}")
        print_table(rows)
    print(json.dumps(report, indent=None if args.json_only else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
