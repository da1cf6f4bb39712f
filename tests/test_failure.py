"""A failed task's log in a few lines (infra/jobs/failure.py), on a recorded
Keras 3 failure whose exception prints a whole batch; and the hint for a
strategy that does not fit the job's tasks."""

from __future__ import annotations

from pathlib import Path

from infra.jobs.failure import LINE_CHARS, TAIL_LINES, condense, strategy_hint

RECORDED = Path(__file__).parent / "recorded"


def test_a_long_exception_is_cut_to_its_first_and_last_lines() -> None:
    log = (RECORDED / "keras3-fit-mwms-chief.log").read_text().splitlines()
    assert len(log) == 100
    shown = condense(log)
    assert shown[0] == "Traceback (most recent call last):"
    assert shown[1].startswith('  File "/home/user/.venv/') and "convert_to_eager_tensor" in shown[1]
    assert shown[3] == "ValueError: Attempt to convert a value (PerReplica:{"
    assert shown[-2] == "  ... (84 more lines: `deploy.py logs` has them all)"
    assert shown[-1].startswith("}) with an unsupported type (<class 'tensorflow.python.distribute")
    assert len(shown) == 8  # the traceback line, the frame (2), 3 + 1 + 1 of the exception


def test_without_a_traceback_the_last_lines_each_cut() -> None:
    log = [f"line {i}" for i in range(40)] + ["x" * 5000, "", ""]
    shown = condense(log)
    assert len(shown) == TAIL_LINES and shown[0] == "line 26"
    assert len(shown[-1]) == LINE_CHARS and shown[-1].endswith("...")


def test_the_last_traceback_counts_and_tensorflows_load_log_is_left_out() -> None:
    log = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in <module>',
        "KeyError: 'old'",
        "retrying",
        "Traceback (most recent call last):",
        '  File "a.py", line 3, in <module>',
        "    main()",
        '  File "a.py", line 9, in main',
        "    raise SystemExit(f(x))",
        "           ^^^^^^^^^^^^",
        "ValueError: bad",
    ]
    assert condense(log) == [
        "Traceback (most recent call last):",
        '  File "a.py", line 9, in main',
        "    raise SystemExit(f(x))",
        "ValueError: bad",
    ]
    assert condense([*log[:1], "boom"]) == ["boom"]


def test_a_strategy_that_does_not_fit_gets_its_hint() -> None:
    collective = ["pc-1/ps-0 | ValueError: There is no id for task_type 'ps'"]
    assert "--no-ps" in (strategy_hint(collective) or "")
    ps = ["pc-1/chief-0 | ValueError: There must be at least one ps."]
    assert "add a ps to cluster.yaml's roles" in (strategy_hint(ps) or "")
    assert strategy_hint(["pc-1/chief-0 | ValueError: bad"]) is None
