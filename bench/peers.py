"""tfcluster against the ways TensorFlow's own guides train, in one run.

Three pairings on the same local cluster of processes (TF_CONFIG on
loopback, as ``bench/support/loopback.py`` starts the trainer), the same MNIST CNN,
the same batch of 128 examples per worker step and the same pinning as
bench/trainer.py (each computing task on its own core where there are
enough; the ps and the async chief, which only schedules, on the last):

* async, ps + 2 workers + chief: ``python -m trainer --mode async`` vs
  Keras 2 ``Model.fit`` under ``ParameterServerStrategy`` with
  ``steps_per_execution`` (``peer_programs/keras2_ps_fit.py``) vs the
  parameter-server guide's custom loop, one step per scheduled function
  (``peer_programs/ps_guide_loop.py``);
* sync, chief + 1 worker: ``--mode sync`` vs Keras ``Model.fit`` under
  ``MultiWorkerMirroredStrategy`` (``peer_programs/keras2_mwms_fit.py``:
  Keras 2, since Keras 3's fit fails under that strategy, as it says);
* single, one process: ``--mode single`` vs Keras 3 ``Model.fit``
  (bench/trainer.py's).

Each figure is steady examples/s: the first ``--warmup`` steps (tracing,
connecting) are left out, for every program alike. With ``--rounds N``
each round runs every program once and the median is reported: this
machine's speed drifts over minutes, and rounds spread the drift over all
programs alike. The load average (``os.getloadavg``) before and after each
run is in the JSON: on a shared machine it says how far to trust a figure.

Usage: ``python bench/peers.py [--steps N] [--rounds N] [--pairings async,sync]
[--smoke] [--json-only] [--json-out FILE]`` (MNIST from --data-dir or
$MNIST_DIR, as for the trainer).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.peer_programs.common import RESULT  # noqa: E402
from bench.support.loopback import LocalJob  # noqa: E402
from bench.support.output import emit  # noqa: E402
from bench.trainer import placement, run_keras, run_trainer  # noqa: E402

PROGRAMS = REPO / "bench" / "peer_programs"
# What the trainer sets for itself before importing TensorFlow
# (trainer/__main__.py says why), given to every program here alike: with
# one inter-op thread (a task pinned to one core) a peer's ps job hangs for
# good in its first fit, and the pooling allocator is worth a third of a
# step's time; the comparison is of the programs, not of these settings.
PROGRAM_ENV = {"TF_NUM_INTEROP_THREADS": "4", "TF_CPU_ALLOCATOR_USE_BFC": "true"}
# Keras' advice for small models, as a user of fit under a ps would take it:
# many steps per scheduled function (the trainer's --steps-per-call is 10).
# Its fit calls must be whole executions (a warm-up fit of fewer steps than
# one execution never returned): a divisor of both where needed.
PS_FIT_STEPS_PER_EXECUTION = 10
# 100 steps of which 20 warm-up measured async tfcluster at 327-446
# examples/s, where its 2,344-step accuracy run made 1,218 on average (why
# was not measured): a short run says little of the steady state.
STEPS, WARMUP = 400, 100
SMOKE_STEPS, SMOKE_WARMUP = 20, 4


@dataclass(frozen=True)
class Entry:
    """One program of a pairing: tfcluster (a trainer mode) or a peer
    (a program of peer_programs/, or ``keras3_fit``: bench/trainer.py's)."""

    name: str
    mode: str  # the cluster's shape: the trainer's mode of the same tasks
    workers: int
    ps: int
    program: str | None = None  # peer_programs/<program>.py
    # Its flags; "--steps-per-execution" gets ``steps_per_execution``'s value.
    flags: tuple[str, ...] = ()


PAIRINGS: dict[str, list[Entry]] = {
    "async": [
        Entry("tfcluster", "async", 2, 1),
        Entry("keras2_ps_fit", "async", 2, 1, "keras2_ps_fit", ("--steps-per-execution",)),
        Entry("ps_guide_loop", "async", 2, 1, "ps_guide_loop"),
    ],
    "sync": [
        Entry("tfcluster", "sync", 2, 0),
        Entry("keras2_mwms_fit", "sync", 2, 0, "keras2_mwms_fit"),
    ],
    "single": [
        Entry("tfcluster", "single", 1, 0),
        Entry("keras3_fit", "single", 1, 0, "keras3_fit"),
    ],
}  # fmt: skip


@dataclass(frozen=True)
class Settings:
    steps: int
    warmup: int
    batch_size: int
    data_dir: str
    pin: bool
    timeout: float
    # The trainer's own flags besides the run's (a smoke run: smaller calls,
    # so that its few steps log twice and have a steady part).
    trainer_flags: tuple[str, ...] = ()

    @property
    def steps_per_execution(self) -> int:
        """The ps fit's: as many as Keras' advice, in whole executions."""
        return math.gcd(PS_FIT_STEPS_PER_EXECUTION, self.warmup, self.steps - self.warmup)


def peer_flags(entry: Entry, settings: Settings) -> list[str]:
    flags = []
    for flag in entry.flags:
        flags.append(flag)
        if flag == "--steps-per-execution":
            flags.append(str(settings.steps_per_execution))
    return flags


def run_peer(entry: Entry, settings: Settings, root: Path) -> float:
    """A peer program's steady examples/s, from its chief's result line."""
    if entry.program == "keras3_fit":
        s = settings
        return run_keras(s.steps, s.batch_size, s.data_dir, s.pin, s.warmup)
    job = LocalJob(
        mode=entry.mode,
        argv=["--steps", str(settings.steps), "--warmup", str(settings.warmup),
              "--batch-size", str(settings.batch_size), "--data-dir", settings.data_dir,
              *peer_flags(entry, settings)],
        log_dir=root / f"{entry.mode}-{entry.name}-logs",
        workers=entry.workers,
        ps=entry.ps,
        cpus=placement(entry.mode, entry.workers, entry.ps) if settings.pin else {},
        program=[str(PROGRAMS / f"{entry.program}.py")],
    )  # fmt: skip
    try:
        job.start()
        if job.wait(settings.timeout) != 0:
            raise RuntimeError(f"{entry.name} failed\n{job.logs()}")
    finally:
        job.stop()
    lines = [x for x in job.log().splitlines() if x.startswith(RESULT)]
    if not lines:
        raise RuntimeError(f"{entry.name} printed no result\n{job.logs()}")
    return float(json.loads(lines[-1][len(RESULT) :])["examples_per_sec"])


def run_tfcluster(entry: Entry, settings: Settings, root: Path) -> float:
    """The trainer's steady examples/s (from its first log, ``--warmup`` steps in)."""
    s = settings
    summary = run_trainer(
        entry.mode, entry.workers, entry.ps, s.steps, s.batch_size, s.data_dir, root, s.pin,
        ("--log-every", str(s.warmup), *s.trainer_flags),
    )  # fmt: skip
    return float(summary["steady_examples_per_sec"])


def run_entry(entry: Entry, settings: Settings, root: Path) -> dict[str, Any]:
    run: Callable[[Entry, Settings, Path], float] = (
        run_tfcluster if entry.program is None else run_peer
    )
    load_before = os.getloadavg()[0]
    speed = run(entry, settings, root)
    return {"examples_per_sec": speed, "load": [load_before, os.getloadavg()[0]]}


def measure(
    pairings: list[str], settings: Settings, rounds: int, say: Callable[[str], None]
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every program of every pairing, once per round: pairing -> name -> runs."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {p: {} for p in pairings}
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        for round_ in range(rounds):
            for pairing in pairings:
                for entry in PAIRINGS[pairing]:
                    root = Path(tmp) / f"round-{round_}" / pairing
                    result = run_entry(entry, settings, root)
                    runs[pairing].setdefault(entry.name, []).append(result)
                    say(
                        f"round {round_ + 1}: {pairing} {entry.name}: "
                        f"{result['examples_per_sec']:.0f} ex/s (load {result['load'][0]:.1f})"
                    )
    return runs


def make_report(
    runs: dict[str, dict[str, list[dict[str, Any]]]], settings: Settings, rounds: int
) -> dict[str, Any]:
    """Each program's median, and tfcluster's ratio to each peer and the best."""
    pairings: dict[str, Any] = {}
    for pairing, programs in runs.items():
        results = {
            name: {
                "examples_per_sec": statistics.median(r["examples_per_sec"] for r in entries),
                "rounds": [r["examples_per_sec"] for r in entries],
                "load": [r["load"] for r in entries],
            }
            for name, entries in programs.items()
        }
        ours = results["tfcluster"]["examples_per_sec"]
        peers = {k: v["examples_per_sec"] for k, v in results.items() if k != "tfcluster"}
        best = max(peers, key=lambda k: peers[k])
        pairings[pairing] = {
            "results": results,
            "tfcluster_vs": {k: ours / v for k, v in peers.items()},
            "best_peer": best,
            "vs_best_peer": ours / peers[best],
        }
    return {
        "model": "cnn",
        "batch_size": settings.batch_size,
        "steps": settings.steps,
        "warmup": settings.warmup,
        "rounds": rounds,
        "cpus": len(os.sched_getaffinity(0)),
        "pinned": settings.pin,
        "ps_fit_steps_per_execution": settings.steps_per_execution,
        "pairings": pairings,
    }


def table(report: dict[str, Any]) -> str:
    lines = [f"{'pairing':<8}{'program':<17}{'examples/s':>11}{'tfcluster vs it':>17}{'load':>7}"]
    for pairing, found in report["pairings"].items():
        for name, entry in found["results"].items():
            ratio = found["tfcluster_vs"].get(name)
            shown = f"{ratio:>16.2f}x" if ratio is not None else f"{'':>17}"
            load = statistics.median(x[0] for x in entry["load"])
            lines.append(f"{pairing:<8}{name:<17}{entry['examples_per_sec']:>11.0f}{shown}{load:>7.1f}")
        lines.append(
            f"{'':<8}{'vs best peer':<17}{'':>11}{found['vs_best_peer']:>16.2f}x"
            f"  ({found['best_peer']})"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS, help="steps per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=WARMUP,
                        help="steps left out of the timing, every program alike")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1, choices=range(1, 11), metavar="N")
    parser.add_argument("--pairings", default=",".join(PAIRINGS),
                        help=f"comma-separated, of {', '.join(PAIRINGS)}")  # fmt: skip
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"{SMOKE_STEPS} steps, {SMOKE_WARMUP} of warm-up: that every program runs",
    )
    parser.add_argument("--data-dir", default=os.environ.get("MNIST_DIR"))
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument("--json-out", type=Path, help="also write the JSON report here")
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=len(os.sched_getaffinity(0)) >= 2,
        help="one core per computing task, as bench/trainer.py pins (default on 2+ CPUs)",
    )
    args = parser.parse_args()
    pairings = [p.strip() for p in args.pairings.split(",") if p.strip()]
    unknown = [p for p in pairings if p not in PAIRINGS]
    if unknown or not pairings:
        parser.error(f"--pairings: choose from {', '.join(PAIRINGS)}")
    steps, warmup = (SMOKE_STEPS, SMOKE_WARMUP) if args.smoke else (args.steps, args.warmup)
    if not 0 < warmup < steps:
        parser.error("--warmup must be between 0 and --steps")
    from trainer.data.mnist import resolve_data_dir

    for name, value in PROGRAM_ENV.items():  # the children's environment
        os.environ.setdefault(name, value)
    settings = Settings(
        steps=steps,
        warmup=warmup,
        batch_size=args.batch_size,
        data_dir=str(resolve_data_dir(args.data_dir)),  # download once, before timing
        pin=args.pin,
        timeout=300 if args.smoke else 1800,
        trainer_flags=("--steps-per-call", "2") if args.smoke else (),
    )

    def say(line: str) -> None:
        if not args.json_only:
            print(line, flush=True)

    report = make_report(measure(pairings, settings, args.rounds, say), settings, args.rounds)
    emit(report, table(report), json_only=args.json_only, json_out=args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
