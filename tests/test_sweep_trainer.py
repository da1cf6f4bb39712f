"""The built-in trainer on the local cluster: `train --sweep` over learning
rates (each trial one process), and `--mode ensemble` (chief and worker
each train their own CNN on their own half of the data; the chief scores
both and their average). Real TensorFlow, few steps: slow-marked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from deploy import cli

pytestmark = pytest.mark.slow

TWO_NODES = "name: two\nprovider: local\nnodes: [pc-1, pc-2]\nroles: {chief: pc-1, worker: pc-2}\n"


def deploy(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def two_nodes(tmp_path: Path, mnist_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MNIST_DIR", str(mnist_dir))
    config = tmp_path / "two.yaml"
    config.write_text(TWO_NODES)
    return config


def test_train_sweep_over_learning_rates_marks_the_best(two_nodes: Path, tmp_path: Path) -> None:
    dest = tmp_path / "results"
    code, out = deploy(
        "--config", str(two_nodes), "train", "--model", "cnn", "--steps", "20",
        "--batch-size", "16", "--sweep", "learning_rate=1e-3,1e-5", "--dest", str(dest),
        "--", "--checkpoint-every", "0", "--log-every", "10",
    )  # fmt: skip
    assert code == 0, out
    (folder,) = list(dest.iterdir())
    data = json.loads((folder / "sweep.json").read_text())
    assert [t["state"] for t in data["trials"]] == ["done", "done"]
    for trial in data["trials"]:
        summary = json.loads((folder / trial["name"] / "summary.json").read_text())
        assert summary["mode"] == "single" and summary["workers"] == 1
        assert summary["learning_rate"] == float(trial["params"]["learning_rate"])
        assert trial["metrics"]["test_accuracy"] == summary["test_accuracy"]
    code, out = deploy("report", str(folder), "--json")
    assert code == 0, out
    rows = json.loads(out)
    best = max(rows, key=lambda r: r["metrics"]["test_accuracy"])
    assert [r["best"] for r in rows] == [r is best for r in rows]
    code, out = deploy("report", str(folder))
    assert f"best: trial {best['trial']} (learning_rate=" in out
    assert (folder / "report.png").is_file()


def test_ensemble_of_two_cnns_beats_or_equals_its_best_member(
    two_nodes: Path, tmp_path: Path
) -> None:
    """Chief and worker each train a CNN on their own half of the 8,000
    training images; the chief scores both members and their average on
    the 2,000 test images."""
    dest = tmp_path / "results"
    code, out = deploy(
        "--config", str(two_nodes), "train", "--mode", "ensemble", "--model", "cnn",
        "--steps", "60", "--batch-size", "32", "--dest", str(dest),
        "--", "--checkpoint-every", "0", "--log-every", "20",
    )  # fmt: skip
    assert code == 0, out
    (run,) = list(dest.iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["mode"] == "ensemble" and summary["workers"] == 2
    ensemble = summary["ensemble"]
    members = ensemble["members"]
    assert [(m["task"], m["model"]) for m in members] == [("chief-0", "cnn"), ("worker-0", "cnn")]
    # Two members of their own: trained from other seeds on other data.
    assert members[0]["test_accuracy"] != members[1]["test_accuracy"]
    assert summary["test_accuracy"] == ensemble["test_accuracy"]
    best = max(m["test_accuracy"] for m in members)
    assert ensemble["best_member_accuracy"] == best
    assert ensemble["test_accuracy"] >= best, ensemble
    assert ensemble["gain"] == pytest.approx(ensemble["test_accuracy"] - best)
    code, out = deploy("report", str(run), "--plot", str(tmp_path / "r.png"))
    assert code == 0, out
    assert f"ensemble of 2: test accuracy {ensemble['test_accuracy']:.4f}" in out
    assert f"gain {ensemble['gain']:+.4f}" in out
