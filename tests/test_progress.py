"""The chief's progress protocol, parsed from recorded lines."""

from __future__ import annotations

import json
import time

from infra.jobs.progress import ProgressEvent, StartupClock, describe, format_seconds, parse_line
from trainer.loop.progress import STARTUP_ENV

RECORDED = """\
2026-11-22 21:00:01 INFO loading MNIST from /data/mnist
@tfcluster {"event": "start", "model": "cnn", "mode": "async", "total_steps": 600, "workers": 2, "ps": 1, "output_dir": "runs/x", "resumed_from_step": 0}
@tfcluster {"event": "progress", "step": 100, "total_steps": 600, "loss": 0.3512, "metrics": {"accuracy": 0.9}, "examples_per_sec": 1523.4, "steps_per_sec": 11.9, "elapsed": 8.4, "eta": 42.0}
@tfcluster {"event": "progress", "step": 2
@tfcluster {"event": "checkpoint", "step": 200, "path": "runs/x/checkpoints/ckpt-2"}
@tfcluster {"event": "done", "summary": {"steps": 600, "training_seconds": 50.2, "examples_per_sec": 1530.0, "test_accuracy": 0.981}}
"""


def test_events_and_plain_lines() -> None:
    events = [parse_line(line) for line in RECORDED.splitlines()]
    kinds = [e.kind if e else None for e in events]
    # A torn event line (the 4th) is shown as text, never a crash.
    assert kinds == [None, "start", "progress", None, "checkpoint", "done"]
    progress = events[2]
    assert progress is not None
    assert progress.get("step") == 100 and progress.get("metrics") == {"accuracy": 0.9}
    assert describe(progress) == "step 100/600 loss 0.3512 accuracy 0.9 1523 ex/s eta 42s"
    done = events[5]
    assert done is not None
    assert "test accuracy 0.9810" in describe(done)
    start = events[1]
    assert start is not None
    assert describe(start) == "training cnn (async) for 600 steps on 2 worker(s), 1 ps"


def test_startup_stages_are_one_line_each() -> None:
    first = parse_line(
        '@tfcluster {"event":"startup","stage":"first_step","seconds":0.81,"total":5.93}'
    )
    assert first is not None
    assert describe(first) == "startup: first step 0.8 s, 5.9 s from the command"
    ours = ProgressEvent("startup", {"stage": "start_tasks", "seconds": 0.2})
    assert describe(ours) == "startup: tasks started 0.2 s"
    # A stage this version does not know, named by a node: shown by name.
    odd = parse_line(r'@tfcluster {"event":"startup","stage":"\u001b[2Jx","seconds":1.5}')
    assert odd is not None
    assert describe(odd) == "startup: x 1.5 s"  # the terminal control is gone


def test_startup_clock_marks_stages_and_tells_the_chief() -> None:
    seen: list[ProgressEvent] = []
    clock = StartupClock(seen.append, started=time.monotonic() - 1.0)
    clock.mark("sync")
    told = json.loads(clock.for_chief()[STARTUP_ENV])
    assert [(e.kind, e.get("stage")) for e in seen] == [("startup", "sync")]
    assert told["command"] >= 1.0 and told["sync"] >= 0.0 and told["start_tasks"] >= 0.0
    assert abs(told["issued"] - time.time()) < 5


def test_format_seconds() -> None:
    assert format_seconds(5) == "5s"
    assert format_seconds(125) == "2m05s"
    assert format_seconds(3725) == "1h02m"


def test_hostile_numbers_from_a_node_are_text_never_a_crash() -> None:
    """Python's json takes NaN, Infinity, 400-digit integers (float() of
    which overflows), 5000-digit ones (past int's conversion limit) and
    arrays nested past the recursion limit: a node's line with any of them
    is its text (tests/test_protocol.py has the whole table), and what
    describes an event still copes with a number it is handed."""
    huge = "1" * 400
    lines = [
        '@tfcluster {"event": "progress", "step": 1, "eta": NaN}',
        '@tfcluster {"event": "progress", "step": 1, "loss": 1e400, "eta": Infinity}',
        '@tfcluster {"event": "progress", "step": 1, "loss": H, "metrics": {"a": H}}',
        '@tfcluster {"event": "startup", "stage": "build", "seconds": H}',
        '@tfcluster {"event": "done", "summary": {"test_accuracy": H}}',
        '@tfcluster {"event": "x", "a": ' + "1" * 5000 + "}",
        '@tfcluster {"event": "x", "a": ' + "[" * 100_000 + "}",
    ]
    for line in (text.replace("H", huge) for text in lines):
        assert parse_line(line) is None, line[:80]
    event = ProgressEvent("progress", {"step": 1, "loss": int(huge), "eta": float("nan")})
    assert describe(event) == "step 1/0 loss ? 0 ex/s eta ?"
    assert format_seconds(float("nan")) == format_seconds(float("inf")) == "?"
