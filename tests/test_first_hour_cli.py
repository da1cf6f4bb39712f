"""What a new user met in the first hour (issue 30), on the local cluster
through the command line: TensorFlow's load-time log left out of `run`,
`exec` and `logs` unless --raw, ..."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from deploy import cli
from tests.procs import none_left_in

REPO = Path(__file__).resolve().parents[1]
NOISE = REPO / "tests" / "recorded" / "tf-load-log-here.txt"


def deploy(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(REPO / "tests" / "programs" / "stand_in.py", folder / "stand_in.py")
    shutil.copy(NOISE, folder / "noise.txt")
    yield folder
    none_left_in(folder)


def test_tensorflows_load_log_is_left_out_unless_raw(workdir: Path) -> None:
    code, out = deploy("exec", "--workdir", str(workdir), "--node", "pc-1", "--", "cat", "noise.txt")
    assert code == 0, out
    assert out.splitlines() == ["pc-1 | 2.21.0"]
    code, out = deploy(
        "exec", "--raw", "--workdir", str(workdir), "--node", "pc-1", "--", "cat", "noise.txt"
    )
    assert code == 0 and "cpu_feature_guard.cc" in out and "absl::InitializeLog" in out, out

    code, out = deploy("run", "--workdir", str(workdir), "--env", "PRINT_FILE=noise.txt",
                       "--", "python", "stand_in.py")  # fmt: skip
    assert code == 0, out
    assert "chief-0 started" in out and "2.21.0" in out
    assert "cpu_feature_guard" not in out and "absl" not in out and "To enable" not in out, out
    code, out = deploy("logs")
    assert code == 0 and "pc-2/worker-0 2.21.0" in out and "pc-1/chief-0 2.21.0" in out, out
    assert "cpu_feature_guard" not in out and "absl" not in out, out
    code, out = deploy("logs", "--raw")
    assert code == 0 and out.count("cpu_feature_guard") == 4, out  # ps, 2 workers, chief


def test_logs_follow_ends_when_the_job_ends_and_says_so(workdir: Path) -> None:
    """A --detach job whose ps and workers would serve forever: the follow
    ends with its chief, and what it left running is stopped (the fixture
    finds no process left); followed again, it says so at once."""
    code, out = deploy("run", "--detach", "--workdir", str(workdir), "--env", "CHIEF_SLEEP=4",
                       "--env", "CHIEF_CODE=3", "--", "python", "stand_in.py")  # fmt: skip
    assert code == 0, out
    run_id = out.split("job ", 1)[1].split(":", 1)[0]
    began = time.monotonic()
    code, out = deploy("logs", "--follow")
    assert code == 0, out
    assert "pc-1/chief-0 chief says goodbye" in out and "pc-3/worker-1 worker-1 started" in out
    assert out.splitlines()[-1] == f"job {run_id} has ended (exit code 3): nothing more to follow"
    assert time.monotonic() - began < 120
    code, out = deploy("logs", "--follow", "--lines", "1")
    assert code == 0, out
    assert out.splitlines()[-1] == f"job {run_id} had ended already (exit code 3): nothing more to follow"


def test_a_task_that_hangs_before_listening_is_shown_while_it_is_waited_for(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own line as it comes, a line per half minute waited (output not
    a terminal), then the error with its last lines and exit 9."""
    monkeypatch.setenv("TFCLUSTER_READY_WAIT", "35")
    began = time.monotonic()
    code, out = deploy("run", "--workdir", str(workdir), "--env", "HANG_TASK=worker-1",
                       "--", "python", "stand_in.py")  # fmt: skip
    assert code == 9, out
    assert "pc-3/worker-1 | worker-1 is loading its data" in out
    waited = re.findall(r"^waiting for (\S+) on (\S+) to listen on port \d+ \((\d+) s\): (.*)$",
                        out, re.MULTILINE)  # fmt: skip
    assert len(waited) == 1, out  # the others listened at once
    assert waited[0][:2] == ("worker-1", "pc-3") and 30 <= int(waited[0][2]) <= 35
    assert waited[0][3] == "worker-1 is loading its data"
    assert "error: worker-1 on pc-3 did not listen on its port within 35 s" in out
    assert "pc-3/worker-1 | worker-1 is loading its data" in out.split("error:")[0].splitlines()[-1]
    assert time.monotonic() - began < 100


def test_on_a_terminal_the_wait_is_a_live_line_per_task(workdir: Path) -> None:
    """In a pseudo-terminal: the line of the task not listening yet is
    redrawn with its seconds counting up, its last line of output in it."""
    import os
    import pty
    import subprocess
    import sys

    main, child = pty.openpty()
    env = {**os.environ, "TFCLUSTER_READY_WAIT": "8", "COLUMNS": "200", "TERM": "xterm"}
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "deploy.py"), "run", "--workdir", str(workdir),
         "--env", "HANG_TASK=worker-1", "--", "python", "stand_in.py"],
        stdin=child, stdout=child, stderr=child, env=env, cwd=workdir,
    )  # fmt: skip
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child's end closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert proc.wait(timeout=60) == 9
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    seconds = {
        int(s) for s in re.findall(
            r"waiting for worker-1 on pc-3 to listen on port \d+ \((\d+) s\): worker-1 is loading its data",
            text,
        )
    }  # fmt: skip
    assert len(seconds) >= 3 and max(seconds) >= 5, text  # redrawn as the seconds go by
    assert "did not listen on its port within 8 s" in text


def test_small_refusals_say_what_is_true() -> None:
    """`stop` of the local cluster does not call its nodes someone else's;
    a node name the cluster has not is a bad argument (exit 2)."""
    assert deploy("up")[0] == 0
    code, out = deploy("stop")
    assert code == 3 and "not ours" not in out, out
    assert "the local cluster's nodes are folders and processes on this machine" in out
    code, out = deploy("logs", "pc-9")
    assert code == 2 and out.strip() == "error: pc-9 is not a node of local (pc-1, pc-2, pc-3)"


def test_hints_name_the_program_as_it_was_typed(tmp_path: Path) -> None:
    """Typed as `tfcluster`, the commands a line suggests say tfcluster."""
    runner = CliRunner()
    result = runner.invoke(cli, ["fetch", "--dest", str(tmp_path)], prog_name="tfcluster")
    assert result.exit_code == 3 and "run `tfcluster train` or `tfcluster run` first" in result.output
    assert "deploy.py" not in result.output
    result = runner.invoke(cli, ["fetch", "--dest", str(tmp_path)], prog_name="deploy.py")
    assert "run `deploy.py train` or `deploy.py run` first" in result.output


def test_a_warning_piped_is_one_whole_line(workdir: Path) -> None:
    """Output that is no terminal wraps nothing, warnings included (rich's
    log grid cut them at 80 columns)."""
    (workdir / "requirements.txt").write_text("numpy\n")
    result = CliRunner().invoke(
        cli, ["run", "--workdir", str(workdir), "--", "python", "stand_in.py"]
    )
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert (
        "WARNING  the local cluster runs this machine's Python; install requirements.txt into "
        "it yourself"
    ) in lines, result.stderr
    # Every warning (the namespace's too) is one line: nothing continues it.
    assert not [x for x in lines if x.startswith(" ")], result.stderr


def test_a_sweeps_shell_script_reads_the_trials_variable(tmp_path: Path) -> None:
    """`bash -c '... "${LR}"'`, as the README writes it: "${LR}" is the
    shell's, not a placeholder {LR} without its --param (it was refused)."""
    from infra.sweeps.spec import command_spec, parse_params

    script = 'echo "${LR} {lr}" > "$TFCLUSTER_RUN_DIR/lr.txt"'
    spec = command_spec(["bash", "-c", script], parse_params(["lr=0.1,0.01"]))
    assert spec.command({"lr": "0.1"}) == ("bash", "-c", 'echo "${LR} ${LR}" > "$TFCLUSTER_RUN_DIR/lr.txt"')
    dest = tmp_path / "sweeps"
    code, out = deploy("sweep", "--param", "lr=0.1,0.01", "--workdir", str(tmp_path),
                       "--dest", str(dest), "--", "bash", "-c", script)  # fmt: skip
    assert code == 0, out
    (sweep,) = list(dest.iterdir())
    got = sorted((t / "lr.txt").read_text() for t in sweep.glob("trial-*"))
    assert got == ["0.01 0.01\n", "0.1 0.1\n"], got


def test_every_mistake_of_a_cluster_yaml_is_a_line_of_its_own(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "name: mine\nprovider: local\nnodse: [pc-1]\n"
        "job:\n  steps: many\n  batch_size: 0\n"
    )
    code, out = deploy("--config", str(config), "status")
    assert code == 2, out
    assert out.splitlines() == [
        f"error: {config}: nodse: unknown key; did you mean 'nodes'?",
        f"error: {config}: job.steps: 'many': Input should be a valid integer",
        f"error: {config}: job.batch_size: 0: Input should be greater than or equal to 1",
    ], out


def test_a_job_that_failed_at_start_is_the_last_job(workdir: Path) -> None:
    code, out = deploy("run", "--workdir", str(workdir), "--env", "FAIL_TASK=worker-1",
                       "--env", "FAIL_CODE=4", "--", "python", "stand_in.py")  # fmt: skip
    assert code == 4, out
    code, out = deploy("status")
    assert code == 0 and "last job: stand-in-" in out and ": python stand_in.py (exit code 4)" in out
    code, out = deploy("logs", "pc-3")
    assert code == 0 and "worker-1 fails on purpose" in out, out


def test_a_worker_that_died_is_named_with_its_own_exit_code(workdir: Path) -> None:
    code, out = deploy("run", "--workdir", str(workdir), "--env", "DIE_TASK=worker-1",
                       "--env", "DIE_CODE=4", "--env", "CHIEF_SLEEP=4", "--env", "CHIEF_CODE=1",
                       "--", "python", "stand_in.py")  # fmt: skip
    assert code == 1, out  # the chief's, as documented
    assert "error: the chief exited with code 1; worker-1 on pc-3 exited with code 4" in out, out
    assert "pc-3/worker-1 | worker-1 dies mid-job" in out


def test_a_ready_wait_that_is_no_number_is_one_line(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TFCLUSTER_READY_WAIT", "soon")
    code, out = deploy("run", "--workdir", str(workdir), "--", "python", "stand_in.py")
    assert code == 2 and out.splitlines()[-1].startswith(
        "error: TFCLUSTER_READY_WAIT='soon': not a number of seconds"
    ), out
    assert deploy("status")[0] == 0  # what only looks at a job never reads it


def test_logs_follow_after_the_chief_ended_ends_the_job_at_once(workdir: Path) -> None:
    """Its --detach job's chief has ended, its ps and workers serve on:
    they are stopped (the fixture finds none left) and the end is said."""
    code, out = deploy("run", "--detach", "--workdir", str(workdir), "--env", "CHIEF_CODE=5",
                       "--", "python", "stand_in.py")  # fmt: skip
    assert code == 0, out
    run_id = out.split("job ", 1)[1].split(":", 1)[0]
    time.sleep(3)  # the chief says goodbye at once
    code, out = deploy("logs", "--follow")
    assert code == 0, out
    assert out.splitlines()[-1] == f"job {run_id} had ended already (exit code 5): nothing more to follow"
