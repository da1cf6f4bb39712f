"""The chief's progress protocol, parsed from recorded lines."""

from __future__ import annotations

from infra.progress import describe, format_seconds, parse_line

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


def test_format_seconds() -> None:
    assert format_seconds(5) == "5s"
    assert format_seconds(125) == "2m05s"
    assert format_seconds(3725) == "1h02m"
