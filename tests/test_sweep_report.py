"""`deploy.py report` on a sweep folder and on an ensemble run, from files
written here (hostile ones too), and the ensemble mode's flags."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from deploy import cli
from trainer.flags import parse_args

HOSTILE = "[red]x[/] \x1b[2J:smile: $(id)"


def deploy(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def write_sweep(folder: Path, trials: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True)
    (folder / "sweep.json").write_text(
        json.dumps({"sweep_id": "sweep-1", "params": {"lr": [], "tag": []}, "trials": trials})
    )
    return folder


def trial(i: int, lr: str, state: str = "done", **metrics: float) -> dict[str, Any]:
    return {
        "trial": i, "name": f"trial-{i}", "params": {"lr": lr, "tag": HOSTILE},
        "state": state, "node": "pc-1", "seconds": 1.5, "metrics": metrics,
    }  # fmt: skip


def test_best_by_loss_is_the_smallest_and_text_is_data(tmp_path: Path) -> None:
    folder = write_sweep(
        tmp_path / "sweep",
        [
            trial(0, "0.1", loss=0.5),
            trial(1, "0.01", loss=0.2),
            trial(2, "0.001", state="failed", loss=0.01),  # failed: never the best
            {"trial": "x", "params": "not a dict", "metrics": {"loss": "NaN"}},
        ],
    )
    code, out = deploy("report", str(folder))
    assert code == 0, out
    assert "best: trial 1 (lr=0.01 tag=[red]x[/] :smile: $(id)): loss 0.2" in out
    assert "\x1b" not in out
    assert "best loss (lower is better)" in out
    assert (folder / "report.png").stat().st_size > 0
    code, out = deploy("report", str(folder), "--json")
    assert [r["best"] for r in json.loads(out)] == [False, True, False, False]


def test_metric_choice(tmp_path: Path) -> None:
    folder = write_sweep(
        tmp_path / "sweep",
        [trial(0, "a", test_accuracy=0.9, loss=0.1), trial(1, "b", test_accuracy=0.8, loss=0.05)],
    )
    code, out = deploy("report", str(folder), "--json")
    assert [r["best"] for r in json.loads(out)] == [True, False]  # accuracy first, higher
    code, out = deploy("report", str(folder), "--json", "--metric", "loss")
    assert [r["best"] for r in json.loads(out)] == [False, True]
    code, out = deploy("report", str(folder), "--metric", "nope")
    assert code == 2 and "--metric nope: no finished trial has it" in out
    # Categorical values (a, b) plot as categories.
    assert (folder / "report.png").is_file()


def test_unreadable_sweep_json_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "sweep.json").write_text("{not json")
    code, out = deploy("report", str(folder))
    assert code == 2 and "not readable JSON" in out and len(out.strip().splitlines()) == 1


def test_report_shows_the_ensemble_gain(tmp_path: Path) -> None:
    run = tmp_path / "cnn-ensemble-1"
    run.mkdir()
    members = [
        {"task": "chief-0", "model": "cnn", "test_accuracy": 0.95},
        {"task": "worker-0", "model": HOSTILE, "test_accuracy": 0.955},
    ]
    summary = {
        "model": "cnn", "mode": "ensemble", "workers": 2, "steps": 60,
        "training_seconds": 30.0, "examples_per_sec": 100.0, "test_accuracy": 0.9625,
        "ensemble": {"members": members, "test_accuracy": 0.9625},
    }  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    code, out = deploy("report", str(run), "--plot", str(tmp_path / "r.png"))
    assert code == 0, out
    assert "ensemble of 2: test accuracy 0.9625, best member 0.9550: gain +0.0075" in out
    assert "\x1b" not in out


def test_ensemble_flags() -> None:
    config = parse_args(["--mode", "ensemble", "--ensemble-models", "cnn,convnet"])
    assert config.ensemble_models == ("cnn", "convnet")
    assert parse_args(["--mode", "ensemble"]).ensemble_models == ()
    for argv in (
        ["--mode", "ensemble", "--model", "dae"],
        ["--mode", "ensemble", "--ensemble-models", "cnn,sdae"],
        ["--mode", "sync", "--ensemble-models", "cnn"],
        ["--mode", "ensemble", "--resume"],
    ):
        with pytest.raises(SystemExit) as exc:
            parse_args(argv)
        assert exc.value.code == 2


HUGE = "1" * 400  # valid JSON; float() of it overflows


@pytest.mark.parametrize(
    ("text", "metrics"),
    [
        ('{"trials": [{"trial": 0, "state": "done", "metrics": {"acc": 0.5}, "seconds": H}]}',
         {"acc": 0.5}),
        ('{"trials": [{"trial": 0, "state": "done", "metrics": {"acc": H, "loss": 0.1}}]}',
         {"loss": 0.1}),
    ],
)  # fmt: skip
def test_a_number_past_floats_range_is_left_out(
    tmp_path: Path, text: str, metrics: dict[str, float]
) -> None:
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "sweep.json").write_text(text.replace("H", HUGE))
    code, out = deploy("report", str(folder), "--json")
    assert code == 0, out
    (row,) = json.loads(out)
    assert (row["metrics"], row["seconds"]) == (metrics, None)


@pytest.mark.parametrize(
    "text", ['{"trials": [' + "1" * 5000 + "]}", '{"trials": ' + "[" * 100_000 + "]" * 100_000 + "}"]
)
def test_json_python_cannot_read_is_one_line(tmp_path: Path, text: str) -> None:
    """A 5000-digit integer (past Python's conversion limit) or arrays
    nested past the recursion limit: one line, exit 2, as any bad JSON."""
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "sweep.json").write_text(text)
    code, out = deploy("report", str(folder))
    assert code == 2 and "not readable JSON" in out and len(out.strip().splitlines()) == 1, out


def test_an_ensemble_member_past_floats_range_is_not_a_crash(tmp_path: Path) -> None:
    run = tmp_path / "cnn-ensemble-1"
    run.mkdir()
    summary = (
        '{"model": "cnn", "mode": "ensemble", "workers": 2, "steps": 60, '
        '"training_seconds": 30.0, "examples_per_sec": 100.0, "test_accuracy": 0.9, '
        '"ensemble": {"test_accuracy": 0.9, "members": [{"task": "chief-0", "test_accuracy": '
        + HUGE + '}, {"task": "worker-0", "test_accuracy": 0.8}]}}'
    )
    (run / "summary.json").write_text(summary)
    code, out = deploy("report", str(run), "--plot", str(tmp_path / "r.png"))
    assert code == 0, out
    assert "best member 0.8000" in out


def test_the_plot_of_a_sweep_of_many_parameters_stays_a_picture(tmp_path: Path) -> None:
    """A sweep.json naming 30 parameters made a 15000-pixel-wide figure
    (hundreds: half a minute of CPU, then matplotlib's refusal); the
    first MAX_PANELS are plotted."""
    import struct

    from infra.reports.sweeps import MAX_PANELS

    names = [f"p{i}" for i in range(30)]
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "sweep.json").write_text(json.dumps({
        "params": {n: ["1"] for n in names},
        "trials": [{"trial": 0, "state": "done", "params": dict.fromkeys(names, "1"),
                    "metrics": {"acc": 0.5}}],
    }))  # fmt: skip
    code, out = deploy("report", str(folder))
    assert code == 0, out
    width = struct.unpack(">I", (folder / "report.png").read_bytes()[16:20])[0]
    assert width <= MAX_PANELS * 500, width


def test_a_report_png_symlink_is_replaced_not_written_through(tmp_path: Path) -> None:
    """A sweep folder from elsewhere with report.png -> ~/.bashrc: the
    plot overwrote the file the link pointed to."""
    victim = tmp_path / "bashrc"
    victim.write_text("export KEEP=1\n")
    folder = write_sweep(tmp_path / "sweep", [trial(0, "0.1", loss=0.5)])
    (folder / "report.png").symlink_to(victim)
    code, out = deploy("report", str(folder))
    assert code == 0, out
    assert victim.read_text() == "export KEEP=1\n"
    assert not (folder / "report.png").is_symlink()
    assert (folder / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_names_from_a_sweep_are_drawn_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parameter, value, metric or sweep named as mathtext that does not
    parse (`$\\frac{$`) made `report` exit 70 at savefig; a user's
    matplotlibrc with text.usetex (no LaTeX here) too."""
    import matplotlib

    monkeypatch.setitem(matplotlib.rcParams, "text.usetex", True)
    math = "$\\frac{$"
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "sweep.json").write_text(json.dumps({
        "sweep_id": math,
        "params": {math: [], "lr": []},
        "trials": [
            {"trial": i, "state": "done", "params": {math: f"{math}{i}", "lr": lr},
             "metrics": {math: 0.5 + i, "loss": [1]}, "seconds": "slow"}
            for i, lr in enumerate(["0.1", "0.01"])
        ],
    }))  # fmt: skip
    code, out = deploy("report", str(folder))
    assert code == 0, out
    assert f"sweep {math}: best {math} (higher is better)" in out
    assert f"best: trial 1 ({math}={math}1 lr=0.01): {math} 1.5" in out
    assert (folder / "report.png").read_bytes()[:4] == b"\x89PNG"
