"""The one filter of TensorFlow's load-time log (infra/jobs/tf_noise.py), on
lines recorded here and quoted from other machines; nothing else of
TensorFlow's, or of the program's, is taken for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.jobs.tf_noise import is_tf_noise

RECORDED = Path(__file__).parent / "recorded"


def test_the_recorded_load_log_is_all_noise_and_the_answer_is_kept() -> None:
    here = (RECORDED / "tf-load-log-here.txt").read_text().splitlines()
    assert [x for x in here if not is_tf_noise(x)] == ["2.21.0"]
    elsewhere = (RECORDED / "tf-load-log-elsewhere.txt").read_text().splitlines()
    assert len(elsewhere) == 15 and all(is_tf_noise(x) for x in elsewhere)


@pytest.mark.parametrize(
    "line",
    [
        "2.21.0",
        "trainer: error: I0000 in a message is the trainer's",
        "I0000 00:00:1795659607.1   28868 loop.cc:12] any other log line is kept",
        "W0000 00:00:1741640125.5    4606 port.cc:153] a warning of port.cc that is not oneDNN's",
        "E0000 00:00:1741640125.5    4606 cuda_executor.cc:1228] failed call to cuInit: UNKNOWN ERROR",
        "2025-03-10 15:55:25.1: E tensorflow/core/common_runtime/x.cc:1] an error is kept",
        "print('port.cc:153] oneDNN custom operations are on')",
        "  I0000 00:00:1.1 1 port.cc:153] oneDNN custom operations are on (indented: not TF's)",
        "To enable the following instructions, read the manual",
        "",
    ],
)
def test_other_lines_are_kept(line: str) -> None:
    assert not is_tf_noise(line)
