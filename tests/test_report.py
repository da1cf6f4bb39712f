"""Training time compared: rows, speedups and the plot from run folders."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest
from click.testing import CliRunner

from infra.reports.compare import ReportError, compute_rows, load_run, load_runs, write_plot


def make_run(
    root: Path,
    name: str,
    *,
    # One JSON value a line: an object, or a string for a torn line.
    metrics: Sequence[dict[str, Any] | str] | None = None,
    **summary: Any,
) -> Path:
    folder = root / name
    folder.mkdir()
    base = {"ps": 0, "steps": 600, "batch_size": 128}
    (folder / "summary.json").write_text(json.dumps({**base, **summary}))
    if metrics is not None:
        (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return folder


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    def curve(seconds: float) -> list[dict[str, Any]]:
        return [
            {"step": s, "loss": 1.0 / s, "accuracy": 0.5 + s / 1300, "elapsed": seconds * s / 600}
            for s in (200, 400, 600)
        ]

    return [
        make_run(tmp_path, "cnn-1", model="cnn", mode="async", workers=1, ps=1,
                 training_seconds=60.0, examples_per_sec=1280.0, test_accuracy=0.981,
                 metrics=curve(60.0)),
        make_run(tmp_path, "cnn-2", model="cnn", mode="async", workers=2, ps=1,
                 training_seconds=33.0, examples_per_sec=2304.0, test_accuracy=0.979,
                 metrics=curve(33.0)),
        make_run(tmp_path, "cnn-sync-2", model="cnn", mode="sync", workers=2,
                 training_seconds=50.0, examples_per_sec=3072.0, test_accuracy=0.985),
        make_run(tmp_path, "cnn-single", model="cnn", mode="single", workers=1,
                 training_seconds=40.0, examples_per_sec=1920.0, test_accuracy=0.986),
        make_run(tmp_path, "dae-3", model="dae", mode="async", workers=3, ps=1,
                 training_seconds=20.0, examples_per_sec=9000.0, psnr_corrupted=13.3,
                 psnr_reconstructed=21.5,
                 metrics=[{"step": 100, "loss": 0.02, "psnr": 18.0, "elapsed": 5.0}, "torn"]),
    ]  # fmt: skip


def test_rows_carry_the_summary_and_speedups_over_the_one_worker_run(runs: list[Path]) -> None:
    rows = {row.run: row for row in compute_rows(load_runs(runs))}
    one, two = rows["cnn-1"], rows["cnn-2"]
    assert (one.model, one.mode, one.workers, one.ps, one.steps) == ("cnn", "async", 1, 1, 600)
    assert (one.training_seconds, one.examples_per_sec) == (60.0, 1280.0)
    assert one.speedup == 1.0
    assert two.speedup == pytest.approx(2304.0 / 1280.0)  # 1.8x: same mode's 1-worker run
    # No 1-worker sync run: the single-process run is the baseline.
    assert rows["cnn-sync-2"].speedup == pytest.approx(3072.0 / 1920.0)
    assert rows["cnn-single"].speedup == 1.0
    assert (two.metric, two.value) == ("test_accuracy", 0.979)
    dae = rows["dae-3"]
    assert dae.speedup is None  # no 1-worker dae run to compare with
    assert (dae.metric, dae.value) == ("psnr_reconstructed", 21.5)
    assert dae.as_dict()["speedup"] is None and dae.as_dict()["run"] == "dae-3"


def test_metrics_lines_are_read_and_torn_lines_skipped(runs: list[Path]) -> None:
    assert [m["step"] for m in load_run(runs[0]).metrics] == [200, 400, 600]
    assert load_run(runs[4]).metrics == [{"step": 100, "loss": 0.02, "psnr": 18.0, "elapsed": 5.0}]
    assert load_run(runs[2]).metrics == []


def test_plot_is_written_from_rows_or_runs(runs: list[Path], tmp_path: Path) -> None:
    rows = compute_rows(load_runs(runs))
    from_rows = write_plot(rows, tmp_path / "rows.png")
    from_runs = write_plot(load_runs(runs), tmp_path / "runs.png")
    for png in (from_rows, from_runs):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        height, width, _ = matplotlib.image.imread(png).shape
        # Speedup, time to accuracy and time to PSNR side by side.
        assert width > 2.5 * height


def test_missing_summary_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "unfinished").mkdir()
    with pytest.raises(ReportError, match=r"unfinished/summary.json: missing"):
        load_run(tmp_path / "unfinished")
    with pytest.raises(ReportError, match="no such run folder"):
        load_run(tmp_path / "nowhere")


def test_corrupt_summary_names_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "summary.json").write_text('{"model": "cnn",')
    with pytest.raises(ReportError, match=r"broken/summary.json: not readable JSON"):
        load_run(broken)
    (broken / "summary.json").write_text('{"model": "cnn", "mode": "async"}')
    with pytest.raises(ReportError, match="missing workers, steps, training_seconds"):
        load_run(broken)
    assert issubclass(ReportError, ValueError)


MATH = "$\\frac{$"  # mathtext that does not parse: matplotlib raised at savefig


def _hostile_runs(root: Path) -> list[Path]:
    return [
        make_run(root, "words", model=MATH, mode="$x^{$", workers="two", ps=[1], steps="many",
                 training_seconds="slow", examples_per_sec=None, test_accuracy="high",
                 metrics=[{"elapsed": 1.0, "accuracy": "x"}, {"elapsed": 2.0, "accuracy": 0.5}]),
        make_run(root, "bools", model=MATH, mode="async", workers=True, steps=1e400,
                 training_seconds=True, examples_per_sec=10**400, test_accuracy=True),
        make_run(root, "$one$", model=MATH, mode="async", workers=1, training_seconds=10.0,
                 examples_per_sec=100.0, test_accuracy=0.9,
                 metrics=[{"elapsed": 10**400, "accuracy": 0.7}, {"elapsed": 5, "accuracy": 0.8}]),
    ]  # fmt: skip


def test_values_that_are_not_numbers_are_shown_as_text(tmp_path: Path) -> None:
    """A summary.json from a node: `int("two")` ended `report` with exit
    70; now each value that is not a number is its text, and only real
    numbers take part in speedups and the plot."""
    words, bools, one = compute_rows(load_runs(_hostile_runs(tmp_path)))
    assert (words.workers, words.ps, words.steps) == ("two", "[1]", "many")
    assert (words.training_seconds, words.examples_per_sec) == ("slow", "None")
    assert (words.metric, words.value, words.speedup) == (None, None, None)
    assert (bools.workers, bools.steps, bools.training_seconds) == ("True", "inf", "True")
    assert bools.examples_per_sec == "1" + "0" * 59 and bools.speedup is None  # cut short
    assert (one.workers, one.speedup) == (1, 1.0)  # True is no 1-worker run


def test_report_of_hostile_summaries_exits_0_and_draws_names_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through `deploy.py report`, with a user's matplotlibrc asking for
    LaTeX (which is not installed here): names are drawn as written."""
    import matplotlib

    from deploy import cli

    monkeypatch.setitem(matplotlib.rcParams, "text.usetex", True)
    runs = [str(p) for p in _hostile_runs(tmp_path)]
    plot = tmp_path / "report.png"
    result = CliRunner().invoke(cli, ["report", *runs, "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert "two" in result.output and "slow" in result.output and MATH in result.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = CliRunner().invoke(cli, ["report", *runs, "--json", "--plot", str(plot)])
    assert json.loads(result.output)[0]["workers"] == "two"


def test_a_layers_runs_hostile_placement_is_shown_not_a_crash(tmp_path: Path) -> None:
    """A --mode layers summary.json from a node: a byte count past a
    float's range ended `report` with exit 70 (OverflowError in the
    placement table); it is shown as unknown, as a count that is not one."""
    from deploy import cli

    cpu = "/job:worker/replica:0/task:0/device:CPU:0"
    run = make_run(
        tmp_path, "layers", model="cnn", mode="layers", workers=2, training_seconds=5.0,
        examples_per_sec=10.0, test_accuracy=0.9,
        placement={"conv2d/kernel": cpu, "dense/kernel": "[bold]x[/]", "d/b": "y", "e/b": "z"},
        params_per_device={cpu: 10**400, "[bold]x[/]": -5, "y": True, "z": 2_000_000},
        stages=[1, 2], bubble=0.5, stage_seconds=[1e400, 2.0],
    )  # fmt: skip
    result = CliRunner().invoke(cli, ["report", str(run), "--plot", str(tmp_path / "p.png")])
    assert result.exit_code == 0, result.output
    rows = {ln.split()[1]: ln for ln in result.output.splitlines() if ln.startswith("│ ")}
    assert "[bold]x[/]" in rows and "-" in rows["[bold]x[/]"].split("│")[2], result.output
    assert " - " in rows[cpu] and "2.00" in rows["z"], result.output


def test_names_in_the_plot_are_not_mathtext(tmp_path: Path) -> None:
    from matplotlib.text import Text

    from infra.reports.compare import literal_text, plot_figure

    with literal_text():
        fig = plot_figure(load_runs(_hostile_runs(tmp_path)))
        texts = [t for t in fig.findobj(Text) if MATH in t.get_text()]
        assert texts and not any(t._preprocess_math(t.get_text())[1] for t in texts)
def test_report_puts_its_plot_beside_the_runs_not_in_the_current_folder(
    runs: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One run: into its folder; several of one folder: into that folder."""
    from click.testing import CliRunner

    from deploy import cli

    here = tmp_path / "elsewhere"
    here.mkdir()
    monkeypatch.chdir(here)
    result = CliRunner().invoke(cli, ["report", str(runs[0])])
    assert result.exit_code == 0, result.output
    assert (runs[0] / "report.png").is_file() and f"plot: {runs[0] / 'report.png'}" in result.output
    result = CliRunner().invoke(cli, ["report", str(runs[0]), str(runs[1])])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "report.png").is_file() and not list(here.iterdir())
