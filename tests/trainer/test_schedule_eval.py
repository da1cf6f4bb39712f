"""``--lr-schedule`` (cosine by default) and ``--eval-every`` (test accuracy
during training): the flags, the schedule's values, when evaluations fall,
and real runs on the offline MNIST that show both at work (single and
async mode: the async chief evaluates variables that live on the ps)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from infra.jobs.progress import describe, parse_line
from tests.trainer.cluster import LocalJob, read_summary
from tests.trainer.conftest import StartJob
from trainer.flags import parse_args
from trainer.loop.progress import Progress

TIMEOUT = 600


def test_the_schedule_is_the_models_unless_asked() -> None:
    assert parse_args([]).lr_schedule == "cosine"
    assert parse_args(["--model", "convnet"]).lr_schedule == "cosine"
    assert parse_args(["--lr-schedule", "constant"]).lr_schedule == "constant"
    # The autoencoders' short pretraining phases learn less under a decay.
    assert parse_args(["--model", "sdae"]).lr_schedule == "constant"
    assert parse_args(["--model", "dae"]).lr_schedule == "constant"
    assert parse_args(["--model", "sdae", "--lr-schedule", "cosine"]).lr_schedule == "cosine"
    assert parse_args([]).eval_every is None
    assert parse_args(["--eval-every", "0.5"]).eval_every == 0.5


@pytest.mark.parametrize(
    "argv", [["--lr-schedule", "linear"], ["--eval-every", "0"], ["--eval-every", "-1"]]
)
def test_bad_schedule_or_eval_interval_exits_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2


def test_cosine_decays_over_the_phase_to_zero_and_constant_stays() -> None:
    from trainer.loop import schedules
    from trainer.models.base import Phase

    phase = Phase("train", 100, 300, [], lambda batch: (batch, {}), ())
    cosine = schedules.learning_rate(parse_args(["--learning-rate", "0.002"]), phase)
    assert not isinstance(cosine, float)
    values = [float(cosine(step)) for step in (0, 100, 200)]  # the phase's own count
    assert values == pytest.approx([0.002, 0.001, 0.0], abs=1e-7)
    constant = parse_args(["--learning-rate", "0.002", "--lr-schedule", "constant"])
    assert schedules.learning_rate(constant, phase) == 0.002


def test_evaluations_fall_every_interval_and_once_per_crossing(tmp_path: Path) -> None:
    from trainer.loop.loops import Monitor
    from trainer.loop.outputs import RunLog

    runlog = RunLog(tmp_path, Progress(io.StringIO()), enabled=False, total_steps=100,
                    examples_per_step=1, start_step=0)  # fmt: skip
    seen: list[int] = []
    monitor = Monitor(runlog, None, log_every=1000, checkpoint_every=0,  # type: ignore[arg-type]
                      eval_every=30, evaluate=seen.append)  # fmt: skip
    for step in (10, 29, 30, 31, 55, 75, 100):
        monitor.reached(step)
    # 60 crossed on the way to 75: scored once, there; 90 on the way to 100.
    assert seen == [30, 75, 100]
    assert Monitor(runlog, None, log_every=1, checkpoint_every=0).eval_every == 0  # type: ignore[arg-type]


def test_an_eval_event_is_one_protocol_line_and_a_readable_row() -> None:
    out = io.StringIO()
    Progress(out).emit("eval", step=31, epoch=0.5, train_s=12.5, test_accuracy=0.97)
    event = parse_line(out.getvalue().strip())
    assert event is not None and event.kind == "eval"
    assert describe(event) == "eval at step 31 (epoch 0.50, 12 s of training): test_accuracy 0.9700"


def run_and_read(job: LocalJob, output: Path) -> dict:
    code = job.wait(TIMEOUT)
    assert code == 0, job.logs()
    summary = read_summary(output)
    events = [e for e in job.events() if e.kind == "eval"]
    # The chief says each evaluation as it happens, as summary.json lists it.
    said = [(e.get("step"), e.get("test_accuracy")) for e in events]
    assert said == [(r["step"], r["test_accuracy"]) for r in summary["evaluations"]]
    return summary


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["single", "async"])
def test_a_run_scores_the_test_set_every_half_epoch_and_ends_its_cosine(
    start_job: StartJob, tmp_path: Path, mode: str
) -> None:
    """One epoch of the 8,000 images (63 steps of 128) scored at its half and
    its end; the cosine's step size is 0 at the last step, and the
    accuracy is a real one (not a fixed figure: it rises past chance)."""
    output = tmp_path / "run"
    job = start_job(
        mode,
        ["--model", "cnn", "--epochs", "1", "--eval-every", "0.5", "--log-every", "10",
         "--checkpoint-every", "0", "--steps-per-call", "5", "--output-dir", str(output)],
        workers=1,
        ps=1 if mode == "async" else 0,
    )  # fmt: skip
    summary = run_and_read(job, output)
    rows = summary["evaluations"]
    steps = [r["step"] for r in rows]
    if mode == "single":
        assert steps == [31, 62], rows
    else:  # the chief scores when it sees the global step past the mark
        assert len(steps) == 2 and 31 <= steps[0] < 62 <= steps[1] <= 64, rows
    assert [r["epoch"] for r in rows] == pytest.approx([s * 128 / 8000 for s in steps], abs=1e-3)
    assert 0.5 < rows[0]["test_accuracy"] <= rows[1]["test_accuracy"] + 0.02, rows
    assert rows[0]["train_s"] < rows[1]["train_s"] <= summary["training_seconds"]
    assert summary["lr_schedule"] == "cosine"
    assert summary["final_learning_rate"]["train"] < 1e-5, summary["final_learning_rate"]
    assert summary["evaluation_seconds"] == pytest.approx(sum(r["eval_s"] for r in rows), abs=0.01)
    lines = (output / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(x)["examples_per_sec"] > 0 for x in lines)


@pytest.mark.slow
def test_a_constant_rate_stays_and_no_evaluation_runs_unless_asked(
    start_job: StartJob, tmp_path: Path
) -> None:
    output = tmp_path / "run"
    job = start_job(
        "single",
        ["--model", "cnn", "--steps", "20", "--lr-schedule", "constant", "--learning-rate",
         "0.002", "--checkpoint-every", "0", "--output-dir", str(output)],
    )  # fmt: skip
    summary = run_and_read(job, output)
    assert summary["final_learning_rate"] == {"train": pytest.approx(0.002)}
    assert summary["evaluations"] == [] and summary["eval_every"] is None
