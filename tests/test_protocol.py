"""The chief's protocol lines from a hostile program: only a line that
starts with the prefix and whose fields have their kind's type is an
event; anything else is the program's text, and nothing it prints ends
the command or the job.

The table feeds ``parse_line`` (the one reader of every consumer: the live
view, ``logs``, sweeps' metrics, the job's result). The last test runs a
real ``run`` under a pseudo-terminal, so the rich live view is on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from rich.console import Console

from infra.cluster.api import Cluster
from infra.config.loader import default_config
from infra.jobs.progress import describe
from infra.jobs.protocol import SCHEMAS, ProgressEvent, parse_line
from infra.jobs.run import JobReporter
from infra.sweeps.trial import line_metrics
from tests.procs import none_left_in
from tfcluster_cli import consoles
from tfcluster_cli.progress_view import TrainView

REPO = Path(__file__).resolve().parents[1]
STAND_IN = REPO / "tests" / "programs" / "stand_in.py"
HUGE = "1" * 400  # valid JSON; float() of it overflows

# Lines that are text, not events: each would have reached a reader before.
HOSTILE = {
    "echoed": 'echoing input: @tfcluster {"event":"start","total_steps":"400"}',
    "indented": ' @tfcluster {"event":"start","total_steps":400}',
    "string count": '@tfcluster {"event":"start","total_steps":"400"}',
    "float step": '@tfcluster {"event":"progress","step":1.5}',
    "bool step": '@tfcluster {"event":"progress","step":true}',
    "negative step": '@tfcluster {"event":"progress","step":-1}',
    "huge step": '@tfcluster {"event":"progress","step":' + HUGE + "}",
    "string loss": '@tfcluster {"event":"progress","step":1,"loss":"low"}',
    "NaN": '@tfcluster {"event":"progress","step":1,"eta":NaN}',
    "Infinity": '@tfcluster {"event":"progress","step":1,"eta":-Infinity}',
    "1e400": '@tfcluster {"event":"progress","step":1,"loss":1e400}',
    "huge loss": '@tfcluster {"event":"progress","step":1,"loss":' + HUGE + "}",
    "metrics list": '@tfcluster {"event":"progress","step":1,"metrics":[1,2]}',
    "nested metric": '@tfcluster {"event":"progress","step":1,"metrics":{"a":{"b":1}}}',
    "text metric": '@tfcluster {"event":"metrics","accuracy":"0.9"}',
    "bool metric": '@tfcluster {"event":"metrics","accuracy":true}',
    "many metrics": '@tfcluster {"event":"metrics",'
    + ",".join(f'"m{i}":1' for i in range(101))
    + "}",
    "nested name": '@tfcluster {"event":"phase","name":{"a":"b"}}',
    "list message": '@tfcluster {"event":"error","message":["x"]}',
    "summary text": '@tfcluster {"event":"done","summary":"all good"}',
    "summary steps": '@tfcluster {"event":"done","summary":{"steps":"ten"}}',
    "summary accuracy": '@tfcluster {"event":"done","summary":{"test_accuracy":[1]}}',
    "startup seconds": '@tfcluster {"event":"startup","stage":"build","seconds":"soon"}',
    "unknown kind": '@tfcluster {"event":"reboot","now":true}',
    "kind not text": '@tfcluster {"event":5}',
    "no kind": '@tfcluster {"step":1}',
    "array": '@tfcluster [{"event":"start"}]',
    "string": '@tfcluster "start"',
    "number": "@tfcluster 400",
    "null": "@tfcluster null",
    "torn": '@tfcluster {"event":"progress","step":2',
    "5000 digits": '@tfcluster {"event":"metrics","a":' + "1" * 5000 + "}",
    "nested deep": '@tfcluster {"event":"metrics","a":' + "[" * 100_000 + "}",
}


@pytest.mark.parametrize("line", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_malformed_protocol_line_is_the_programs_text(line: str) -> None:
    assert parse_line(line) is None
    assert line_metrics(line) == {}  # a sweep's table takes nothing from it


def test_fields_arrive_typed_and_clean() -> None:
    """Markup is data (never read: every printer has markup off), terminal
    controls are dropped, long strings cut, unknown fields left out, null
    (the trainer's NaN) kept as null."""
    start = parse_line(
        '@tfcluster {"event":"start","model":"[red]x[/] $\\\\frac{$","mode":"\\u001b[2Jasync",'
        '"total_steps":400,"workers":2,"ps":1,"extra":{"a":[1]}}'
    )
    assert start is not None
    assert start.data == {
        "model": "[red]x[/] $\\frac{$",
        "mode": "async",
        "total_steps": 400,
        "workers": 2,
        "ps": 1,
    }
    assert (
        describe(start) == "training [red]x[/] $\\frac{$ (async) for 400 steps on 2 worker(s), 1 ps"
    )
    error = parse_line('@tfcluster {"event":"error","message":"' + "x\\u0007" * 5000 + '"}')
    assert error is not None and error.get("message") == "x" * 2000
    progress = parse_line(
        '@tfcluster {"event":"progress","step":3,"loss":null,"metrics":{"acc\\u001b]0;t\\u0007":1}}'
    )
    assert progress is not None
    assert progress.data == {"step": 3, "loss": None, "metrics": {"acc": 1}}
    assert describe(progress) == "step 3/0 loss None acc 1 0 ex/s"


def test_a_run_summary_is_typed_where_it_is_read_and_kept_whole() -> None:
    done = parse_line(
        '@tfcluster {"event":"done","summary":{"steps":10,"test_accuracy":0.5,'
        '"model_settings":{"filters":[32,64]},"started":"2026-01-01"}}'
    )
    assert done is not None
    assert done.get("summary") == {
        "steps": 10,
        "test_accuracy": 0.5,
        "model_settings": {"filters": [32, 64]},
        "started": "2026-01-01",
    }


def test_every_kind_the_trainer_writes_has_a_schema() -> None:
    from trainer.loop.progress import Progress

    assert {name for name in vars(Progress) if not name.startswith("_")} - {
        "emit",
        "enabled",
    } <= set(SCHEMAS)


# -- a real `run` on a terminal -------------------------------------------------------

# What the hostile chief prints, then it exits 3.
ECHOED = [
    'echoing input: @tfcluster {"event":"start","total_steps":"400"}',
    '@tfcluster {"event":"start","total_steps":"400"}',
    '@tfcluster {"event":"progress","step":"many","loss":{"a":1}}',
    '@tfcluster {"event":"metrics","loss":NaN}',
    "plain [/x] line",
]
# A well-formed event whose text is markup: shown as it is, described.
MARKUP = '@tfcluster {"event":"phase","name":"[bold red]pwned[/]"}'


def _run_on_a_terminal(argv: list[str], cwd: Path, timeout: float) -> tuple[int, str]:
    """``argv`` with a pseudo-terminal as its stdin, stdout and stderr (120
    columns); its exit code and everything it wrote."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
    for name in ("NO_COLOR", "TERM_PROGRAM", "CI", "GITHUB_ACTIONS"):
        env.pop(name, None)
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError as exc:  # EIO: the terminal's last writer is gone
                if exc.errno != errno.EIO:
                    raise
                break
            if not chunk:
                break
            out += chunk
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()
        os.close(master)
    return code, out.decode("utf-8", "replace")


def test_hostile_protocol_lines_on_a_terminal_are_text_and_the_job_ends_normally(
    tmp_path: Path,
) -> None:
    """The reproduction: a program echoing a protocol line with a
    non-numeric total made `run` exit 70 mid-job. Now the lines are shown as
    the program's text, the chief's own code comes back, and every task is
    stopped as at any job's end."""
    workdir = tmp_path / "project"
    workdir.mkdir()
    shutil.copy(STAND_IN, workdir / "stand_in.py")
    (workdir / "echo.txt").write_text("\n".join([*ECHOED, MARKUP]) + "\n")
    argv = [
        sys.executable, str(REPO / "deploy.py"), "run", "--workdir", str(workdir),
        "--dest", str(tmp_path / "runs"), "--env", "CHIEF_ECHO=echo.txt",
        "--env", "CHIEF_CODE=3", "--", "python", "stand_in.py",
    ]  # fmt: skip
    try:
        code, out = _run_on_a_terminal(argv, tmp_path, timeout=240)
    finally:
        none_left_in(workdir)
    assert "\x1b[?25l" in out, out  # the live view was on: rich hid the cursor
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", out)  # rich's own redrawing
    assert code == 3, shown
    assert "error: the chief exited with code 3" in shown
    assert "exited with code 70" not in shown and "debug.log" not in shown
    for line in ECHOED:
        assert line in shown, line
    assert "phase [bold red]pwned[/]" in shown
    assert "chief says goodbye" in shown


class Failing(JobReporter):
    """A front end with a bug: it fails on every line and event it is given."""

    def __init__(self) -> None:
        self.calls = 0

    def event(self, event: ProgressEvent) -> None:
        self.calls += 1
        raise TypeError("a view's bug")

    def log(self, line: str) -> None:
        self.calls += 1
        raise TypeError("a view's bug")


def test_a_reporter_that_fails_costs_lines_never_the_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    shutil.copy(STAND_IN, workdir / "stand_in.py")
    reporter = Failing()
    try:
        result = Cluster(default_config()).run_program(
            ["python", "stand_in.py"],
            env={"CHIEF_CODE": "4"},
            workdir=workdir,
            dest=tmp_path / "r",
            reporter=reporter,
        )
    finally:
        none_left_in(workdir)
    assert result.exit_code == 4 and result.fetched  # followed to the end, then fetched
    assert reporter.calls >= 2  # the chief's lines were each offered
    assert "could not show a line of the chief's (TypeError" in caplog.text


def test_a_live_view_that_fails_goes_on_in_plain_lines(
    monkeypatch: pytest.MonkeyPatch, tfcluster_home: Path
) -> None:
    out, err = io.StringIO(), io.StringIO()
    for name, file in (("console", out), ("err_console", err)):
        terminal = Console(file=file, force_terminal=True, width=200, highlight=False)
        monkeypatch.setattr(consoles, name, terminal)
    with TrainView(quiet=False) as view:
        assert view.progress is not None
        view.event(ProgressEvent("start", {"model": "cnn", "total_steps": 10}))

        def broken(*args: object, **kwargs: object) -> None:
            raise ZeroDivisionError("a bug of the bar")

        monkeypatch.setattr(view.progress, "update", broken)
        view.event(ProgressEvent("progress", {"step": 5, "loss": 0.5}))  # no exception
        assert view.progress is None  # the bar is given up
        view.event(ProgressEvent("progress", {"step": 6, "loss": 0.25}))
    assert "the progress bar failed (details in" in err.getvalue()
    assert "ZeroDivisionError: a bug of the bar" in (tfcluster_home / "debug.log").read_text()
    shown = out.getvalue()
    assert "step 5/0 loss 0.5000" in shown and "step 6/0 loss 0.2500" in shown
