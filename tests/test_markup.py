"""Text from users, configs and nodes is data on the terminal: never Rich
markup, never an emoji code, never a terminal control (issue 11, finding 2).

The CLI tests run deploy.py against the embedded local cluster (real
processes, real log files) and check that hostile text comes out literally,
with no traceback and the right exit code, and with no control character.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from deploy import cli
from infra.cluster.overview import ClusterOverview, NodeView
from infra.jobs.progress import ProgressEvent, describe, summary_text
from infra.node.facts import Gpu, GpuReport, parse_tail
from infra.spec.job import JobRecord
from infra.text import node_text
from tfcluster_cli import consoles, errors, progress_view, render

# Markup that crashes Rich (a closing tag with nothing open), markup that
# styles or links, and emoji codes (`:b:` is one too).
MARKUP = ["[/x]", "[red]x[/]", "[link=http://e]x[/link]", "a:smile:b", "a:b:c"]

# Recorded hostile node output, and what a reader must see of it.
HOSTILE = {
    "clear": ("before\x1b[2Jafter", "beforeafter"),
    "home and colour": ("\x1b[H\x1b[1;31mred\x1b[0m text", "red text"),
    "osc52 bel": ("copy\x1b]52;c;cm0gLXJmIH4K\x07done", "copydone"),
    "osc52 st": ("copy\x1b]52;c;cm0gLXJmIH4K\x1b\\done", "copydone"),
    "osc8 link": ("\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\ here", "click here"),
    "title": ("\x1b]0;pwned\x07title", "title"),
    "bare cr": ("rm -rf /\rls", "rm -rf / ls"),
    "crlf": ("windows line\r", "windows line"),
    "c1 csi": ("a\x9b2Jb", "ab"),
    "c1 osc": ("a\x9d52;c;eA==\x9cb", "ab"),
    "dcs": ("a\x1bPq#0;2;0;0;0\x1b\\b", "ab"),
    "lone esc": ("a\x1bcb\x1b", "ab"),
    "c0 and del": ("a\x00b\x07c\x08d\x7fe\x0bf\x0cg", "abcdefg"),
    "c1 nel": ("a\x85b", "ab"),
    "unterminated osc": ("a\x1b]8;;http://e", "a"),
    "tab and unicode": ("naïve\t日本語 ✓ → ok", "naïve\t日本語 ✓ → ok"),
}
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def clean(text: str) -> bool:
    """No control character but tab and newline (the lines' own ends)."""
    return not CONTROL.search(text.replace("\n", ""))


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


# -- the sanitiser --------------------------------------------------------------


@pytest.mark.parametrize("raw, shown", list(HOSTILE.values()), ids=list(HOSTILE))
def test_node_text_removes_terminal_controls(raw: str, shown: str) -> None:
    assert node_text(raw) == shown
    assert clean(node_text(raw))


def test_parse_tail_gives_clean_lines_and_task_names() -> None:
    stdout = "==> chief-\x1b[2J0.log <==\n" + "\n".join(raw for raw, _ in HOSTILE.values())
    pairs = list(parse_tail(stdout))
    assert {task for task, _ in pairs} == {"chief-0"}
    assert all(clean(line) for _, line in pairs)


def test_events_are_described_as_clean_text_whatever_their_fields() -> None:
    event = ProgressEvent(
        "progress",
        {"step": "[/x]", "loss": "\x1b]52;c;eA==\x07", "metrics": {"acc\x1b[2J": 0.5}, "eta": 3},
    )
    assert describe(event) == "step [/x]/0 loss acc 0.5 0 ex/s eta 3s"
    assert clean(describe(ProgressEvent("error", {"message": "bad\x1b[2J\x9b1;1H[/x]"})))
    assert clean(describe(ProgressEvent("evil\x1b[2J", {})))
    # A summary with the wrong types is shown, never a crash.
    text = summary_text({"steps": "\x1b[2J", "training_seconds": "x", "test_accuracy": "[/x]"})
    assert text == " steps in x s, 0 examples/s, test accuracy [/x]"


# -- what a user or config writes -------------------------------------------------


def _yaml(tmp_path: Path, **fields: object) -> Path:
    """A local cluster.yaml whose roles have only a chief (no ps, no
    workers), with these top-level fields replaced."""
    data: dict[str, object] = {
        "name": "solo",
        "provider": "local",
        "nodes": ["pc-1"],
        "roles": {"chief": "pc-1", "worker": [], "ps": []},
        "job": {"mode": "single"},
    }
    data.update(fields)
    path = tmp_path / "cluster.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


@pytest.mark.parametrize("hostile", MARKUP)
def test_config_errors_show_names_literally(tmp_path: Path, hostile: str) -> None:
    for fields in ({"name": hostile}, {"nodes": ["pc-1", hostile]}):
        code, out = invoke("--config", str(_yaml(tmp_path, **fields)), "status")
        assert code == 2, out
        assert hostile in out and "Traceback" not in out
    ssh = _yaml(tmp_path, provider="ssh", hosts={"pc-1": hostile})
    code, out = invoke("--config", str(ssh), "status")
    # "[/x]" is read as a bracketed IPv6 address "/x": the message names that.
    assert code == 2 and hostile.strip("[]") in out and "Traceback" not in out
    code, out = invoke("logs", hostile)  # a node name on the command line
    assert code == 2 and f"error: {hostile} is not a node of local" in out


@pytest.mark.parametrize("hostile", MARKUP)
def test_an_unknown_node_is_the_same_error_for_every_command(hostile: str) -> None:
    """One error for a node the cluster has not, whichever command names it:
    a bad argument, exit 2 (it was 3 for `logs NAME`, 2 for `exec --node`
    once); and the name is printed as it was typed."""
    line = f"error: {hostile} is not a node of local (pc-1, pc-2, pc-3)"
    for args in (
        ["exec", "--node", hostile, "--", "true"],
        ["logs", hostile],
        ["ssh", hostile],
        ["forget-host", hostile],
    ):
        code, out = invoke(*args)
        assert (code, out.strip()) == (2, line), args


def test_error_printer_shows_markup_and_no_controls(capsys: pytest.CaptureFixture[str]) -> None:
    from infra.errors import JobFailed

    exc = JobFailed("lost [/x] a:smile:b \x1b]52;c;eA==\x07", details=["pc-1/chief-0 | [red]x[/]"])
    exc.hint = "see [link=http://e]x[/link] a:b:c"
    with pytest.raises(click.exceptions.Exit) as raised:
        errors.fail(exc)
    assert raised.value.exit_code == exc.exit_code
    err = capsys.readouterr().err
    assert "lost [/x] a:smile:b" in err and "[red]x[/]" in err
    assert "[link=http://e]x[/link] a:b:c" in err and clean(err)


def test_warnings_show_node_errors_without_controls(capsys: pytest.CaptureFixture[str]) -> None:
    """A warning quotes a node's error (e.g. a fetch that failed)."""
    import logging

    consoles.setup_logging(False)
    why = "pc-1: \x1b]8;;http://e\x1b\\[/x] a:smile:b\x1b]8;;\x1b\\ \x9b2J"
    logging.getLogger("tfcluster.job").warning("could not fetch the run folder: %s", why)
    err = capsys.readouterr().err
    assert "could not fetch the run folder: pc-1: [/x] a:smile:b" in err and clean(err)


def test_trainer_error_lines_are_not_markup(capsys: pytest.CaptureFixture[str]) -> None:
    """A TF error line naming a task aborted `train` with exit 70."""
    view = progress_view.TrainView(quiet=False)
    view.log("InvalidArgumentError: [/job:ps/replica:0/task:0] a:smile:b")
    err = capsys.readouterr().err
    assert "chief: InvalidArgumentError: [/job:ps/replica:0/task:0] a:smile:b" in err


def test_status_table_cells_are_text(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Status words, zones and undeclared names come from the provider."""
    monkeypatch.setattr(consoles.console, "width", 250)  # one row, no wrapped cell
    view = NodeView(
        name="[/x]",
        status="[red]x[/]",
        state="weird",
        roles=[],
        zone="a:smile:b\x1b]52;c;eA==\x07",
        internal_ip="[link=http://e]x[/link]",
        external_ip=None,
        machine_type="a:b:c",
        accelerators=None,
        preemptible=False,
        declared=False,
        hourly_usd=None,
        gpus=GpuReport((Gpu("[bold]g[/] a:smile:b", 1024, 1),)),
    )
    overview = ClusterOverview(
        name="[/y]",
        provider="local",
        views=[view],
        hourly_usd=None,
        price_source=None,
        idle=None,
        last_job=None,
    )
    render.print_status(overview)
    out = capsys.readouterr().out
    for text in ("[/y] (local)", "[/x]", "[red]x[/]", "a:smile:b", "a:b:c", "[bold]g[/]"):
        assert text in out
    assert "[link=http://e]x[/link]" in out and clean(out)


def test_report_shows_run_names_and_fields_literally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consoles.console, "width", 250)  # one row, no wrapped cell
    run_dir = tmp_path / "[bold]x a:smile:b"  # a folder's name holds no "/"
    run_dir.mkdir()
    summary = {
        "model": "[/x]",
        "mode": "a:b:c",
        "workers": 1,
        "steps": 10,
        "training_seconds": 1.0,
        "examples_per_sec": 10.0,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    code, out = invoke("report", str(run_dir), "--plot", str(tmp_path / "r.png"))
    assert code == 0, out
    for text in ("│ [/x] ", "│ a:b:c ", "│ [bold]x a:smile:b "):
        assert text in out


# -- what a node prints -------------------------------------------------------------

LOG_LINES = MARKUP + [raw for raw, _ in HOSTILE.values()]


def test_logs_print_node_lines_without_controls(tfcluster_home: Path) -> None:
    code, out = invoke("up")
    assert code == 0, out
    # Where the local provider keeps a task's log (infra/node/commands.py _files).
    logs = tfcluster_home / "clusters" / "local" / "nodes" / "pc-1" / "tfcluster" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # Text, and raw bytes that are no UTF-8 (an 8-bit CSI among them).
    (logs / "chief-0.log").write_bytes(
        ("\n".join(LOG_LINES) + "\n").encode() + b"raw\x9b2J\xff bytes\n"
    )
    code, out = invoke("logs", "pc-1", "-n", "100")
    assert code == 0, out
    assert "pc-1/chief-0 raw\ufffd2J\ufffd bytes" in out
    for text in MARKUP:
        assert f"pc-1/chief-0 {text}\n" in out
    assert "pc-1/chief-0 beforeafter" in out and "pc-1/chief-0 click here" in out
    assert "pc-1/chief-0 naïve " in out and "日本語 ✓ → ok" in out  # tab expanded
    assert clean(out)


PROGRAM = """\
import sys
lines = {lines!r}
for line in lines:
    print(line)
sys.stdout.flush()
print("failing now \\x1b]52;c;eA==\\x07", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("exit_code", [0, 3])
def test_run_echoes_the_chief_without_controls(
    tmp_path: Path, exit_code: int, tfcluster_home: Path
) -> None:
    """A chief-only job: the chief's lines, the job line with the command's
    arguments, and (when it fails) the failure details, all literal."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "prog.py").write_text(PROGRAM.format(lines=LOG_LINES))
    config = _yaml(tmp_path)
    code, out = invoke(
        "--config", str(config), "run", "--workdir", str(work), "--dest", str(tmp_path / "d"),
        "--", sys.executable, "prog.py", str(exit_code), "[/x]", "a:smile:b",
    )  # fmt: skip
    assert code == exit_code, out
    assert f"prog.py {exit_code} [/x] a:smile:b" in out  # the job's line
    for text in MARKUP:
        assert f"\n{text}\n" in out
    assert "\nbeforeafter\n" in out and "\ncopydone\n" in out
    assert "failing now" in out and "Traceback" not in out
    if exit_code:
        # The failure details: the last lines of the chief's log.
        assert "pc-1/chief-0 | click here\n" in out and "pc-1/chief-0 | failing now" in out
    assert clean(out)

    # The state file remembers the command; an edited one may say anything.
    code, out = invoke("--config", str(config), "status")
    assert code == 0 and f"prog.py {exit_code} [/x] a:smile:b (exit code {exit_code})" in out
    state_file = tfcluster_home / "clusters" / "solo" / "state.json"
    state = json.loads(state_file.read_text())
    state["last_job"].update(model="[red]x[/]\x1b]52;c;eA==\x07", mode="a:b:c")
    state_file.write_text(json.dumps(state))
    code, out = invoke("--config", str(config), "status")
    assert code == 0 and "[red]x[/], a:b:c (exit code" in out and clean(out)


def test_exec_output_is_literal_and_clean(tmp_path: Path) -> None:
    code, out = invoke("up")
    assert code == 0, out
    text = "\n".join(line for line in LOG_LINES if "\x00" not in line)  # argv: no NUL
    code, out = invoke(
        "exec", "--node", "pc-1", "--workdir", str(tmp_path), "--", "printf", "%s\n", text
    )
    assert code == 0, out
    for line in MARKUP:
        assert f"pc-1 | {line}\n" in out
    assert "pc-1 | copydone" in out and clean(out)


def test_live_progress_bar_shows_metric_names_literally(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal `train` draws a bar whose detail column holds the
    chief's metric names: a `[/x]` there aborted the run (exit 70)."""
    import io

    from rich.console import Console

    out = io.StringIO()
    terminal = Console(file=out, force_terminal=True, width=200, highlight=False, emoji=False)
    monkeypatch.setattr(consoles, "console", terminal)
    with progress_view.TrainView(quiet=False) as view:
        assert view.progress is not None
        view.event(ProgressEvent("start", {"model": "[/x]", "total_steps": 10}))
        metrics = {"[/x]": 0.5, "a:smile:b\x1b[2J": 0.25}
        view.event(ProgressEvent("progress", {"step": 5, "loss": 1.0, "metrics": metrics}))
        view.progress.refresh()
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # Rich's own styling
    assert "training [/x] (None)" in shown
    assert "[/x] 0.500 a:smile:b 0.250" in shown


def test_logs_follow_gives_clean_lines(
    tfcluster_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The --follow path (a stream per node, headers parsed as they come):
    the same files, read by a tail that ends instead of following."""
    from infra.cluster.api import Cluster
    from infra.config.loader import default_config
    from infra.node import commands

    assert invoke("up")[0] == 0
    logs = tfcluster_home / "clusters" / "local" / "nodes" / "pc-2" / "tfcluster" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "worker-\x1b[2J0.log").write_text("\n".join(LOG_LINES) + "\n")
    tail_logs = commands.tail_logs
    monkeypatch.setattr(
        commands, "tail_logs", lambda layout, n, follow, until=None: tail_logs(layout, n, False)
    )
    seen: list[tuple[str, str, str]] = []
    Cluster(default_config()).logs(
        "pc-2", lines=100, follow=True, on_line=lambda *args: seen.append(args)
    )
    assert {task for _, task, _ in seen} == {"worker-0"}
    lines = [line for _, _, line in seen]
    assert all(clean(line) for line in lines)
    assert set(MARKUP) <= set(lines) and "click here" in lines


def test_status_lines_under_the_table_are_literal_and_clean(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The price source (a plug-in provider's Pricing says it), the last
    job's run id and label (the state file), the cluster's title: markup
    literally, terminal controls never."""
    monkeypatch.setattr(consoles.console, "width", 250)
    osc = "\x1b]0;pwned\x07\x1b[2J"
    view = NodeView(
        name="n", status="RUNNING", state="running", roles=["chief"], zone=None,
        internal_ip=None, external_ip=None, machine_type=None, accelerators=None,
        preemptible=False, declared=True, hourly_usd=0.5,
    )  # fmt: skip
    job = JobRecord(
        run_id=f"r[red]x[/red]{osc}", chief_node="n", output_dir="/o",
        command=["python", f"[link=http://e]x[/link]{osc}"],
    )  # fmt: skip
    overview = ClusterOverview(
        name=f"c{osc}", provider="p", views=[view], hourly_usd=0.5,
        price_source=f"[/x]src{osc}", idle=None, last_job=job,
    )  # fmt: skip
    render.print_status(overview)
    out = capsys.readouterr().out
    for text in ("[/x]src", "r[red]x[/red]", "[link=http://e]x[/link]"):
        assert text in out
    assert clean(out), repr(out)
