"""The benchmarks run: each on a few steps (bench/peers.py --smoke,
bench/accuracy.py --smoke), checking the shape of what they report, not
the figures (a few steps on a shared machine say nothing of speed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.support.loopback import REPO

pytestmark = pytest.mark.slow


def run_bench(script: str, *args: str, timeout: float = 900) -> dict:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args, "--json-only"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_peers_runs_every_pairing_and_reports_ratios(mnist_dir: Path) -> None:
    report = run_bench("peers.py", "--smoke", "--data-dir", str(mnist_dir))
    pairings = report["pairings"]
    assert {k: sorted(v["results"]) for k, v in pairings.items()} == {
        "async": ["keras2_ps_fit", "ps_guide_loop", "tfcluster"],
        "sync": ["keras2_mwms_fit", "tfcluster"],
        "single": ["keras3_fit", "tfcluster"],
    }
    for found in pairings.values():
        speeds = {k: v["examples_per_sec"] for k, v in found["results"].items()}
        assert all(s > 0 for s in speeds.values()), speeds
        best = found["best_peer"]
        assert speeds[best] == max(v for k, v in speeds.items() if k != "tfcluster")
        assert found["vs_best_peer"] == pytest.approx(speeds["tfcluster"] / speeds[best])
    assert report["steps"] == 20 and report["ps_fit_steps_per_execution"] == 2


def test_accuracy_trains_every_mode_and_scores_it_during_training(mnist_dir: Path) -> None:
    report = run_bench("accuracy.py", "--smoke", "--data-dir", str(mnist_dir))
    results = report["results"]
    assert list(results) == ["single", "async1", "async2", "sync2", "average2", "ensemble2",
                             "layers2"]  # fmt: skip
    assert report["train_examples"] == 8000 and report["epochs"] == 0.25
    for name, found in results.items():
        # A quarter epoch scored at its half and at its end (async: when the
        # chief sees the global step past the mark, before the end).
        curve = found["accuracy_curve"]
        assert 1 <= len(curve) <= 2, (name, curve)
        assert all(0.0 < acc <= 1.0 for _, _, acc in curve), (name, curve)
        assert 0.0 < found["final_accuracy"] <= 1.0 and found["train_s"] > 0, name
        assert set(found["time_to"]) == {"0.985", "0.990", "0.992"}
