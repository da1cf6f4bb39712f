"""Hostile and careless uses of `deploy.py run`, `exec` and `cancel` on the
local cluster: each test is one attack that once got through. After every
test, no process of the job is left (the `workdir` fixture checks)."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from infra.cluster.api import Cluster
from infra.config.loader import default_config
from infra.errors import ConfigError, Interrupted, RemoteError, StateError
from infra.jobs.job import Job
from infra.providers.local import LocalTransport
from infra.setup.workdir import WorkdirFilter
from infra.spec.job import JobSpec, Program
from infra.spec.tfconfig import TaskSpec
from infra.state.folder import ClusterState
from infra.transport.base import CommandResult
from tests.ports import free_ports
from tests.test_run_local import deploy, workdir

__all__ = ["workdir"]  # the fixture, imported to be used here


ENV_DUMP = """\
import json, os, runpy
with open(os.path.join(os.environ["TFCLUSTER_RUN_DIR"], os.environ["TFCLUSTER_TASK"] + ".env"), "w") as f:
    json.dump(dict(os.environ), f)
runpy.run_path("stand_in.py", run_name="__main__")
"""


@pytest.mark.parametrize("name", ["H", "IFS"])
def test_a_variable_named_like_the_start_scripts_own_reaches_the_task_only(
    workdir: Path, tmp_path: Path, name: str
) -> None:
    """`--env H=...` once moved the pid and log files out of the node (the
    script's paths are "$H"/...), `--env IFS=x` broke the pid file's start
    time: either way the tasks looked dead at once, yet ran on, out of
    reach of `cancel`. Now the job runs, and the task gets the value."""
    (workdir / "env_dump.py").write_text(ENV_DUMP)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "tfcluster" / "logs").mkdir(parents=True)
    value = str(elsewhere) if name == "H" else "x"
    dest = tmp_path / "results"
    code, out = deploy(
        "run", "--workdir", str(workdir), "--dest", str(dest), "--env", f"{name}={value}",
        "--", "python", "env_dump.py",
    )  # fmt: skip
    assert code == 0, out
    (run_dir,) = list(dest.iterdir())
    env = json.loads((run_dir / "chief-0.env").read_text())
    if name == "H":
        assert env["H"] == value
    assert env["TFCLUSTER_RUN_DIR"].endswith(f"/tfcluster/runs/{run_dir.name}")
    assert not list((elsewhere / "tfcluster" / "logs").iterdir())


def test_a_huge_variable_is_one_line_not_a_crash(
    workdir: Path, tmp_path: Path, tfcluster_home: Path
) -> None:
    """A job.env value over the kernel's 128 KiB limit for one argument
    made the local start script unrunnable: an OSError, "a bug in
    tfcluster" (exit 70). No process can be given such a value in its
    environment, so the config refuses it before anything starts: one line
    naming the key, the config error's exit code, never a crash."""
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "name: big\nprovider: local\nnodes: [pc-1, pc-2]\n"
        "roles: {chief: pc-1, worker: [pc-2]}\n"
        f"job:\n  workdir: my project\n  env: {{USER_BIG: {'a' * 200_000}}}\n"
    )
    code, out = deploy("--config", str(config), "run", "--", "python", "stand_in.py")
    assert code == 2, out
    assert "job.env: USER_BIG" in out and "128 KiB" in out
    assert "a bug in tfcluster" not in out and len(out) < 1000
    assert not (tfcluster_home / "clusters" / "big").exists() or not list(
        (tfcluster_home / "clusters" / "big").rglob("*.log")
    )


def test_tasks_started_on_the_nodes_that_answered_are_stopped(
    workdir: Path, tmp_path: Path
) -> None:
    """When one node could not be reached at the start, the tasks the
    other nodes had started were not known (run_all raised and lost their
    output), so they were never stopped: orphans holding their ports."""
    homes = tmp_path / "nodes"
    (homes / "pc-1").mkdir(parents=True)  # pc-2's folder is gone
    transport = LocalTransport(["pc-1", "pc-2"], homes)
    ps, worker, chief = free_ports(3)
    tasks = [
        TaskSpec("ps", 0, "pc-1", "127.0.0.1", ps),
        TaskSpec("worker", 0, "pc-2", "127.0.0.1", worker),
        TaskSpec("chief", 0, "pc-1", "127.0.0.1", chief),
    ]
    program = Program(argv=("python", "stand_in.py"), task_types=("chief", "ps", "worker"))
    job = Job(transport, tasks, JobSpec(run_id="attack-1", program=program), workdir=workdir)
    with pytest.raises(RemoteError, match="pc-2"):
        job.start()
    assert [t.name for t in job.started] == ["ps-0"]
    assert not job.running()  # ps-0 was stopped (the fixture checks no process is left)


def start_tick(pid: int) -> str:
    """Field 22 of /proc/PID/stat, as a task's pid file holds it."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[19]


def test_an_edited_pid_file_never_gets_another_process_killed(
    workdir: Path, tfcluster_home: Path
) -> None:
    """A pid file naming some other process of the user, start time and
    all (as a careless edit or a stale copy may), got that process killed
    by `cancel` (a shell, in the attack). A task's process must also carry
    its TFCLUSTER_TASK."""
    code, out = deploy(
        "run", "--detach", "--workdir", str(workdir), "--env", "CHIEF_SLEEP=600",
        "--", "python", "stand_in.py",
    )  # fmt: skip
    assert code == 0, out
    victim = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        pid_file = tfcluster_home / "clusters/local/nodes/pc-3/tfcluster/logs/worker-1.pid"
        real = pid_file.read_text()
        pid_file.write_text(f"{victim.pid} {start_tick(victim.pid)}\n")
        code, out = deploy("cancel")
        assert code == 0, out
        assert "worker-1" not in out and "chief-0" in out
        time.sleep(0.5)
        assert victim.poll() is None, "cancel killed a process that is no task"
        pid_file.write_text(real)  # the real worker-1 is stopped by the next cancel
        code, out = deploy("cancel")
        assert code == 0 and "stopped worker-1" in out, out
    finally:
        victim.kill()
        victim.wait()


def test_a_gitignore_pattern_that_is_no_regex_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`[z-a]` (a reversed range) makes pathspec raise re.error, which is
    no ValueError: the sync of the working folder crashed ("a bug in
    tfcluster") instead of ignoring that .gitignore as documented."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "train.py").write_text("")
    (tmp_path / "sub" / "data.py").write_text("")
    (tmp_path / "sub" / ".gitignore").write_text("*.log\n[z-a]\n")
    (tmp_path / "sub" / "x.log").write_text("")
    files = sorted(p.relative_to(tmp_path).as_posix() for p in WorkdirFilter(tmp_path).files())
    assert files == ["sub/.gitignore", "sub/data.py", "sub/x.log", "train.py"]
    assert "sub/.gitignore" in caplog.text and "bad character range" in caplog.text


GRACEFUL = """\
import os, runpy, signal, sys, time

def on_term(*_):
    time.sleep(4)  # a chief saving its checkpoint
    open(os.path.join(os.environ["TFCLUSTER_RUN_DIR"], "saved"), "w").close()
    sys.exit(0)

signal.signal(signal.SIGTERM, on_term)
runpy.run_path("stand_in.py", run_name="__main__")
"""


def test_cancel_gives_the_program_its_grace_to_handle_sigterm(
    workdir: Path, tfcluster_home: Path
) -> None:
    """stop_tasks waited for the task's wrapper bash only, which dies of
    the TERM at once: the program in it was KILLed at the same instant,
    whatever it did on SIGTERM (no checkpoint saved on cancel)."""
    (workdir / "graceful.py").write_text(GRACEFUL)
    code, out = deploy(
        "run", "--detach", "--no-ps", "--workdir", str(workdir), "--env", "CHIEF_SLEEP=600",
        "--", "python", "graceful.py",
    )  # fmt: skip
    assert code == 0, out
    time.sleep(1)  # the chief's handler is installed
    code, out = deploy("cancel")
    assert code == 0 and "chief-0" in out, out
    runs = tfcluster_home / "clusters/local/nodes/pc-1/tfcluster/runs"
    assert list(runs.glob("*/saved")), "the chief was killed before its SIGTERM handler ended"


def test_cancel_waits_out_the_grace_on_all_nodes_at_once(workdir: Path) -> None:
    """A program that ignores SIGTERM is KILLed after the grace (10 s);
    the nodes were stopped one after the other, so cancel took 10 s per
    node (30 s for the default cluster)."""
    (workdir / "no_term.py").write_text(
        "import runpy, signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "runpy.run_path('stand_in.py', run_name='__main__')\n"
    )
    code, out = deploy(
        "run", "--detach", "--workdir", str(workdir), "--env", "CHIEF_SLEEP=600",
        "--", "python", "no_term.py",
    )  # fmt: skip
    assert code == 0, out
    time.sleep(1)  # the handlers are installed
    began = time.monotonic()
    code, out = deploy("cancel")
    assert code == 0 and "ps-0" in out and "worker-1" in out, out
    # In parallel: one grace for all (10 s); one node after the other: 30 s.
    assert 9 < time.monotonic() - began < 28


class _CtrlCMidStart(LocalTransport):
    """A real local transport where Ctrl-C comes once pc-2 has started its
    task, while pc-1 is still starting (slow, as over SSH)."""

    def run(self, node: str, command: str, *, timeout: float | None = None) -> CommandResult:
        if node == "pc-1" and "setsid" in command:
            time.sleep(1.0)
        result = super().run(node, command, timeout=timeout)
        if node == "pc-2" and "setsid" in command:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        return result


def test_ctrl_c_while_the_tasks_start_stops_what_was_started(
    workdir: Path, tmp_path: Path
) -> None:
    """Ctrl-C while the start commands ran lost their output (the tasks
    were recorded only once every node had answered), so the tasks the
    nodes had started ran on, orphaned."""
    homes = tmp_path / "nodes"
    for node in ("pc-1", "pc-2"):
        (homes / node).mkdir(parents=True)
    transport = _CtrlCMidStart(["pc-1", "pc-2"], homes)
    ps, worker, chief = free_ports(3)
    tasks = [
        TaskSpec("ps", 0, "pc-1", "127.0.0.1", ps),
        TaskSpec("worker", 0, "pc-2", "127.0.0.1", worker),
        TaskSpec("chief", 0, "pc-1", "127.0.0.1", chief),
    ]
    program = Program(argv=("python", "stand_in.py"), task_types=("chief", "ps", "worker"))
    job = Job(transport, tasks, JobSpec(run_id="attack-2", program=program), workdir=workdir)
    with pytest.raises(Interrupted):
        job.start()
    assert sorted(t.name for t in job.started) == ["ps-0", "worker-0"]
    assert not job.running()


def test_the_sync_never_takes_home_or_root_nor_tfclusters_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`deploy.py run` from ~ without --workdir (the default working folder
    is the current one) synced the whole home to the nodes: ~/.ssh, and
    ~/.tfcluster with every cluster's private key."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("secret")
    monkeypatch.setenv("HOME", str(home))
    for root in (home, Path("/")):
        with pytest.raises(ConfigError, match="everything in it would go to the nodes"):
            WorkdirFilter(root)
    # A project that holds tfcluster's state folder (TFCLUSTER_HOME inside it).
    project = tmp_path / "project"
    keys = project / "state" / "clusters" / "c"
    keys.mkdir(parents=True)
    (keys / "id_ed25519").write_text("secret")
    (project / "train.py").write_text("")
    monkeypatch.setenv("TFCLUSTER_HOME", str(project / "state"))
    files = [p.relative_to(project).as_posix() for p in WorkdirFilter(project).files()]
    assert files == ["train.py"]


BLOCK_DEST = """\
import os, runpy, sys
open(sys.argv[1], "w").close()  # a file where the results would come home
runpy.run_path("stand_in.py", run_name="__main__")
"""


def test_a_destination_that_cannot_be_written_is_refused_before_anything_starts(
    workdir: Path, tmp_path: Path
) -> None:
    """`run --dest /proc/x` (and `train --dest`, or a --dest through a file;
    `sweep --dest` crashed at its start, after the sync) ran the whole job, then warned that the results could not come home
    and exited 0. A --dest that cannot be written is bad input: one line
    naming it, exit 2, and no task started (nor the job remembered)."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    marker = tmp_path / "started"
    (workdir / "block.py").write_text(BLOCK_DEST)
    for dest in (blocker / "sub", Path("/proc/x")):
        for command in (
            ["run", "--workdir", str(workdir), "--dest", str(dest), "--", "python", "block.py", str(marker)],
            ["train", "--dest", str(dest), "--steps", "1"],
            ["sweep", "--param", "a=1", "--workdir", str(workdir), "--dest", str(dest),
             "--", "python", "block.py", str(marker)],
        ):  # fmt: skip
            code, out = deploy(*command)
            assert code == 2, out
            assert out.startswith(f"error: --dest {dest}: ") and len(out.splitlines()) == 1, out
    assert not marker.exists()
    code, out = deploy("fetch")
    assert code == 3 and "no job to fetch" in out
    # The library refuses it too, whichever front end calls it.
    with pytest.raises(ConfigError, match=r"^--dest /proc/x: "):
        Cluster(default_config()).run_program(
            ["python", "block.py", str(marker)], workdir=workdir, dest=Path("/proc/x")
        )
    assert not marker.exists()

    # A destination that goes bad while the job runs is still a warning
    # after it: the job itself succeeded, and `fetch` brings it later.
    later = tmp_path / "later"
    code, out = deploy(
        "run", "--workdir", str(workdir), "--dest", str(later), "--", "python", "block.py", str(later)
    )  # fmt: skip
    assert code == 0, out
    words = " ".join(out.split())  # the warning is wrapped to the terminal's width
    assert "could not fetch the run folder" in words and "Not a directory" in words
    assert "results: still on the chief's node" in out
    for dest in (blocker / "sub", Path("/proc/x")):
        code, out = deploy("fetch", "--dest", str(dest))
        assert code == 2 and out.startswith(f"error: --dest {dest}: "), out
    code, out = deploy("fetch", "--dest", str(later))  # click's own check: a file
    assert code == 2 and f"'{later}' is a file" in out, out
    good = tmp_path / "good"
    code, out = deploy("fetch", "--dest", str(good))
    assert code == 0 and len(list(good.glob("*/chief-0.json"))) == 1, out


def test_a_lock_file_that_is_a_symlink_is_refused_and_its_target_untouched(
    tmp_path: Path, tfcluster_home: Path
) -> None:
    """cluster.lock replaced by a symlink: taking the lock followed it,
    truncated the file it pointed at and wrote the holder's JSON there.
    (state.lock was opened through a link the same way.)"""
    target = tmp_path / "precious"
    target.write_text("precious data\n")
    folder = tfcluster_home / "clusters" / "local"
    folder.mkdir(parents=True)
    (folder / "cluster.lock").symlink_to(target)
    code, out = deploy("cancel")
    assert code == 3, out
    assert "cluster.lock is a symbolic link" in " ".join(out.split()), out
    assert target.read_text() == "precious data\n"

    (folder / "state.lock").symlink_to(tmp_path / "made-through-the-link")
    with pytest.raises(StateError, match=r"state\.lock is a symbolic link"):
        ClusterState("local").update(x=1)
    assert not (tmp_path / "made-through-the-link").exists()


def test_a_state_file_nested_thousands_deep_is_set_aside(tfcluster_home: Path) -> None:
    """json.loads raises RecursionError (no JSONDecodeError) on [[[[...:
    every command of the cluster crashed ("a bug in tfcluster") and the
    file was never set aside, so it stayed broken until deleted by hand."""
    folder = tfcluster_home / "clusters" / "local"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text('{"last_job": ' + "[" * 100_000 + "]" * 100_000 + "}")
    code, out = deploy("status")
    assert code == 0, out
    assert "nested too deep" in " ".join(out.split())
    assert list(folder.glob("state.json.corrupt-*"))
    code, out = deploy("status")  # and the cluster works on from a fresh state
    assert code == 0 and "nested" not in out, out


def _wait_for_chief_exit(tfcluster_home: Path) -> None:
    exit_file = tfcluster_home / "clusters/local/nodes/pc-1/tfcluster/logs/chief-0.exit"
    deadline = time.monotonic() + 30
    while not exit_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert exit_file.exists()


def test_a_detached_job_whose_chief_ended_does_not_keep_the_cluster_busy(
    workdir: Path, tfcluster_home: Path
) -> None:
    """A --detach job ends with its chief, but nobody stops its ps and
    workers: they ran on, and every later `run` was refused ("still
    running", exit 3) until a `cancel`, which then recorded the finished
    job as cancelled (130). Now the next run stops those leftovers, records
    the chief's own code and starts."""
    state = tfcluster_home / "clusters" / "local" / "state.json"
    code, out = deploy("run", "--detach", "--workdir", str(workdir), "--", "python", "stand_in.py")
    assert code == 0, out
    first = json.loads(state.read_text())["last_job"]["run_id"]
    _wait_for_chief_exit(tfcluster_home)
    time.sleep(1.1)  # a new run id (they are to the second)
    code, out = deploy(
        "run", "--detach", "--workdir", str(workdir), "--env", "CHIEF_CODE=5",
        "--", "python", "stand_in.py",
    )  # fmt: skip
    assert code == 0, out
    second = json.loads(state.read_text())["last_job"]
    assert second["run_id"] != first and second["exit_code"] is None
    _wait_for_chief_exit(tfcluster_home)
    # cancel stops the leftovers, and keeps the chief's own exit code.
    code, out = deploy("cancel")
    assert code == 0 and "ps-0" in out and "chief-0" not in out, out
    assert json.loads(state.read_text())["last_job"]["exit_code"] == 5
