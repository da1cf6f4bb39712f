"""`deploy.py run`, `exec` and `cancel` with the user's own programs, on the
local cluster: the two example programs (real TensorFlow), and a stand-in
program without TensorFlow for the contract (TF_CONFIG, TFCLUSTER_*, the
working folder, exit codes, detach, a busy cluster, Ctrl-C). After every
test, no process of the job is left."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from deploy import cli
from infra.cluster.api import Cluster
from infra.config.loader import default_config
from infra.errors import JobFailed, StateError
from infra.jobs.progress import ProgressEvent
from infra.node import facts
from infra.node.autostop_commands import autostop_status
from infra.providers.local import LocalTransport
from tests.procs import none_left_in, processes_in, runs

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "own-program"
STAND_IN = REPO / "tests" / "programs" / "stand_in.py"


def deploy(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """The user's working folder (a space in its name, as users have), with
    the example programs and the stand-in. Afterwards, nothing runs in it."""
    folder = tmp_path / "my project"
    shutil.copytree(EXAMPLES, folder)
    shutil.copy(STAND_IN, folder / "stand_in.py")
    yield folder
    none_left_in(folder)


def result(dest: Path) -> dict[str, Any]:
    (run_dir,) = list(dest.iterdir())
    return json.loads((run_dir / "result.json").read_text())


# -- the example programs: real TensorFlow -------------------------------------------


def test_parameter_server_example(workdir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "results"
    code, out = deploy(
        "run", "--workdir", str(workdir), "--dest", str(dest),
        "--", "python", "ps_program.py", "--steps", "200",
    )  # fmt: skip
    assert code == 0, out
    assert "ps-0@pc-1" in out and "worker-1@pc-3" in out and "chief-0@pc-1" in out
    got = result(dest)
    assert got["cluster"] == {"chief": 1, "ps": 1, "worker": 2}
    assert got["steps"] == 200
    # It fits y = 3x + 2: the variables on the ps reached those values.
    assert abs(got["w"] - 3.0) < 0.1 and abs(got["b"] - 2.0) < 0.1, got
    assert "after 200 steps" in out  # the chief's own output is shown


def test_collective_example_without_ps(workdir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "results"
    code, out = deploy(
        "run", "--no-ps", "--workdir", str(workdir), "--dest", str(dest),
        "--", "python", "collective_program.py", "--steps", "60",
    )  # fmt: skip
    assert code == 0, out
    assert "ps-0" not in out
    got = result(dest)
    assert got["cluster"] == {"chief": 1, "worker": 2}  # no ps task in TF_CONFIG
    assert got["replicas"] == 3 and got["steps"] == 60
    assert got["accuracy"] > 0.9, got


def test_a_collective_program_given_a_ps_is_told_to_start_without_one(workdir: Path) -> None:
    """The ps task of a MultiWorkerMirroredStrategy program dies before it
    listens: the error shows its exception and says what to change."""
    code, out = deploy("run", "--workdir", str(workdir),
                       "--", "python", "collective_program.py", "--steps", "5")  # fmt: skip
    assert code == 1, out
    assert "ps-0 on pc-1 exited before it listened on its port (exit code 1)" in out
    assert "pc-1/ps-0 | ValueError: There is no id for task_type 'ps'" in out
    assert "hint: a collective program (MultiWorkerMirroredStrategy) takes no ps task: " in out


def test_keras_fit_under_multi_worker_mirrored_strategy(workdir: Path, tmp_path: Path) -> None:
    """TensorFlow's multi-worker tutorial as written (tf.keras, the
    strategy, model.fit), with no flag: it gets Keras 2 as tf.keras."""
    dest = tmp_path / "results"
    code, out = deploy(
        "run", "--no-ps", "--workdir", str(workdir), "--dest", str(dest),
        "--", "python", "keras_fit_collective.py", "--epochs", "2", "--steps-per-epoch", "10",
    )  # fmt: skip
    assert code == 0, out
    assert "tf.keras is Keras 2 (tf-keras) for this job: keras_fit_collective.py" in out
    got = result(dest)
    assert got["keras"] == "tf_keras" and got["replicas"] == 3
    assert got["accuracy"] > 0.9, got


def test_keras_fit_under_parameter_server_strategy(workdir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "results"
    code, out = deploy(
        "run", "--workdir", str(workdir), "--dest", str(dest),
        "--", "python", "keras_fit_ps.py", "--epochs", "2", "--steps-per-epoch", "20",
    )  # fmt: skip
    assert code == 0, out
    assert "ps-0@pc-1" in out
    got = result(dest)
    assert got["keras"] == "tf_keras" and got["ps"] == 1
    assert got["accuracy"] > 0.3, got  # four classes: chance is 0.25


def test_tf_keras_programs_get_keras_2_and_keras_programs_keep_keras_3(
    workdir: Path, tmp_path: Path
) -> None:
    """Decided from the main file's text, before anything starts; a
    TF_USE_LEGACY_KERAS of the user's own is left as it is."""
    run_stand_in = "import runpy\nrunpy.run_path('stand_in.py', run_name='__main__')\n"
    (workdir / "k2.py").write_text("import tensorflow as tf  # tf.keras.Sequential\n" + run_stand_in)
    (workdir / "k3.py").write_text("import keras  # and tf.keras\n" + run_stand_in)
    for program, env, want in [
        ("k2.py", [], "1"), ("k3.py", [], None), ("k2.py", ["--env", "TF_USE_LEGACY_KERAS=0"], "0"),
    ]:  # fmt: skip
        dest = tmp_path / f"results-{program}-{len(env)}"
        code, out = deploy("run", "--workdir", str(workdir), "--dest", str(dest), *env,
                           "--", "python", program)  # fmt: skip
        assert code == 0, out
        (run_dir,) = list(dest.iterdir())
        assert json.loads((run_dir / "chief-0.json").read_text())["legacy_keras"] == want
        assert ("tf.keras is Keras 2" in out) == (want == "1" and not env), out


# -- the contract, with a stand-in program ---------------------------------------------


def test_each_task_gets_tf_config_its_folder_env_and_python(
    workdir: Path, tmp_path: Path, tfcluster_home: Path
) -> None:
    """cluster.yaml's job.workdir (relative to the file) and job.env, and
    --env on top; values arrive literally."""
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "name: mine\nprovider: local\nnodes: [pc-1, pc-2, pc-3]\n"
        "roles: {ps: pc-1, chief: pc-1, worker: [pc-2, pc-3]}\n"
        "job:\n  workdir: my project\n"
        "  env: {USER_FROM_YAML: yaml, USER_BOTH: yaml}\n"
    )
    dest = tmp_path / "results"
    hostile = "$(touch pwned) `id` ; [red]x[/] 'q'"
    code, out = deploy(
        "--config", str(config), "run", "--dest", str(dest),
        "--env", f"USER_HOSTILE={hostile}", "--env", "USER_BOTH=flag",
        "--", "python", "stand_in.py", "a b", "--flag=$HOME",
    )  # fmt: skip
    assert code == 0, out
    assert "chief says goodbye" in out
    (run_dir,) = list(dest.iterdir())
    chief = json.loads((run_dir / "chief-0.json").read_text())
    assert chief["task"] == "chief-0" and chief["run_id"] == run_dir.name
    assert chief["tf_config"]["task"] == {"type": "chief", "index": 0}
    cluster = chief["tf_config"]["cluster"]
    assert sorted(cluster) == ["chief", "ps", "worker"]
    assert len(cluster["ps"]) == 1 and len(cluster["worker"]) == 2
    assert chief["cwd"] == str(workdir)
    assert chief["argv"] == ["a b", "--flag=$HOME"]
    assert chief["env"] == {"USER_FROM_YAML": "yaml", "USER_BOTH": "flag", "USER_HOSTILE": hostile}
    # `python` is the environment that has TensorFlow (this venv here).
    assert Path(chief["python"]).parent == Path(sys.executable).parent
    assert not list(tmp_path.rglob("pwned"))
    # Every other task got its own TF_CONFIG and run folder on its node.
    node_runs = tfcluster_home / "clusters" / "mine" / "nodes"
    worker = json.loads((node_runs / "pc-3" / "tfcluster" / "runs" / run_dir.name / "worker-1.json").read_text())
    assert worker["tf_config"]["task"] == {"type": "worker", "index": 1}
    assert worker["tf_config"]["cluster"] == cluster
    assert worker["run_dir"].endswith(f"/runs/{run_dir.name}")

    # status and fetch know the job.
    code, out = deploy("--config", str(config), "status")
    assert code == 0 and f"last job: {run_dir.name}: python stand_in.py" in out
    again = tmp_path / "again"
    code, out = deploy("--config", str(config), "fetch", "--dest", str(again))
    assert code == 0, out
    assert (again / run_dir.name / "chief-0.json").exists()


def test_the_chiefs_exit_code_comes_back_with_its_last_lines(workdir: Path) -> None:
    code, out = deploy(
        "run", "--workdir", str(workdir), "--env", "CHIEF_CODE=5", "--", "python", "stand_in.py"
    )
    assert code == 5, out
    assert "error: the chief exited with code 5" in out
    assert "pc-1/chief-0 | chief-0 started" in out  # the failing task's log


def test_a_task_that_dies_at_start_fails_the_job_at_once(workdir: Path) -> None:
    began = time.monotonic()
    code, out = deploy(
        "run", "--workdir", str(workdir), "--env", "FAIL_TASK=worker-1", "--env", "FAIL_CODE=4",
        "--", "python", "stand_in.py",
    )  # fmt: skip
    assert code == 4, out
    assert "worker-1 on pc-3 exited before it listened on its port (exit code 4)" in out
    assert "pc-3/worker-1 | worker-1 fails on purpose" in out
    assert "ps-0" not in out.split("error:")[1]  # only the dead task is blamed
    assert time.monotonic() - began < 60  # not the readiness timeout


def test_a_chief_started_with_its_tasks_is_stopped_when_one_dies(workdir: Path) -> None:
    """A chief that waits for the others' ports itself (the built-in async
    trainer's) starts with them; a task that dies before it listens still
    fails the job at once, and the chief, started already, is stopped (the
    fixture finds no process left)."""
    cluster = Cluster(default_config())
    spec = cluster.run_spec(
        ["python", "stand_in.py"],
        env={"FAIL_TASK": "worker-1", "FAIL_CODE": "4", "CHIEF_SLEEP": "600"},
    )
    spec = dataclasses.replace(spec, program=dataclasses.replace(spec.program, chief_waits=True))
    seen: list[ProgressEvent] = []
    with pytest.raises(JobFailed, match="worker-1 on pc-3 exited before it listened") as failed:
        cluster.launch(spec, workdir=workdir, on_event=seen.append)
    assert failed.value.exit_code == 4
    assert any("pc-3/worker-1 | worker-1 fails on purpose" in x for x in failed.value.details)
    # The chief was started with the others, before the wait (one after it
    # would never have started).
    assert [e.get("stage") for e in seen if e.kind == "startup"] == ["start_tasks"]
    logs = cluster.state.dir / "nodes" / "pc-1" / "tfcluster" / "logs"
    assert "chief-0 started" in (logs / "chief-0.log").read_text()


def test_a_command_not_found_is_127(workdir: Path) -> None:
    code, out = deploy("run", "--workdir", str(workdir), "--", "no-such-program-x", "--flag")
    assert code == 127, out
    assert "no-such-program-x: command not found" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no command to run"),
        (["--"], "no command to run"),
        (["--bogus", "--", "python"], "No such option '--bogus'"),
        (["--env", "NOEQUALS", "--", "python"], "--env 'NOEQUALS': write KEY=VALUE"),
        (["--env", "TF_CONFIG={}", "--", "python"], "TF_CONFIG is set by tfcluster"),
        (["--env", "1X=a", "--", "python"], "is not a variable name"),
        (["--workdir", "/no/such/folder", "--", "python"], "--workdir: /no/such/folder is not a folder"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    code, out = deploy("run", *args)
    assert code == 2, out
    assert len(out.strip().splitlines()) == 1 and message in out, out


def test_a_missing_job_workdir_is_named_after_its_file(tmp_path: Path) -> None:
    """cluster.yaml's job.workdir, relative to the file, that is not there:
    the line names the file and the key, as every problem of the file."""
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "name: mine\nprovider: local\nnodes: [pc-1, pc-2]\n"
        "roles: {chief: pc-1, worker: pc-2}\njob:\n  workdir: gone\n"
    )
    code, out = deploy("--config", str(config), "run", "--", "python", "x.py")
    assert code == 2, out
    assert len(out.strip().splitlines()) == 1, out
    assert f"{config}: job.workdir: {tmp_path / 'gone'} is not a folder" in out, out


def test_a_node_without_an_address_is_a_state_error_not_a_bad_tf_config() -> None:
    """Nodes the provider reports no internal address of (here: a local
    cluster never brought up): an error naming them, never a TF_CONFIG of
    ":2222"."""
    cluster = Cluster(default_config())
    with pytest.raises(StateError, match=r"no internal address known for pc-1, pc-2, pc-3$") as caught:
        cluster.job_tasks(["ps", "worker", "chief"], ["pc-1", "pc-2", "pc-3"])
    assert "deploy.py status" in (caught.value.hint or "")


def test_detached_job_refuses_a_second_one_and_cancel_stops_it(
    workdir: Path, tfcluster_home: Path
) -> None:
    state, record = _detach(workdir, tfcluster_home)
    running = processes_in(workdir)
    assert len(running) >= 4  # ps, 2 workers, chief

    # A second job is refused, and the running one is left as it was.
    code, out = deploy("run", "--workdir", str(workdir), "--", "python", "stand_in.py")
    assert code == 3, out
    assert f"job {record['run_id']}" in out and "still running" in out and "cancel" in out
    assert json.loads(state.read_text())["last_job"] == record
    assert set(running) <= set(processes_in(workdir))
    code, out = deploy("train", "--steps", "5")
    assert code == 3 and "still running" in out, out
    assert set(running) <= set(processes_in(workdir))

    code, out = deploy("logs")
    assert code == 0 and "chief-0 started" in out and "worker-1 started" in out, out

    code, out = deploy("cancel")
    assert code == 0, out
    assert f"cancelled {record['run_id']}" in out and "chief-0" in out and "ps-0" in out
    assert json.loads(state.read_text())["last_job"]["exit_code"] == 130
    code, out = deploy("cancel")
    assert code == 0 and "nothing to stop" in out


def test_a_busy_cluster_refuses_every_job_in_one_way_and_exec_still_runs(
    workdir: Path, tfcluster_home: Path
) -> None:
    """`run`, `train`, `sweep` and `train --sweep` get their nodes through
    one step (``Cluster.ready_nodes``): with a job running, each is refused
    with the very same line and hint (exit 3), before anything starts;
    `exec` goes through the same step without refusing (its command runs
    beside the job, whose files stay as they are)."""
    state, record = _detach(workdir, tfcluster_home)
    running = processes_in(workdir)
    try:
        refused = {
            "run": deploy("run", "--workdir", str(workdir), "--", "python", "stand_in.py"),
            "train": deploy("train", "--steps", "5"),
            "sweep": deploy(
                "sweep", "--workdir", str(workdir), "--param", "x=1,2", "--", "python", "stand_in.py"
            ),
            "train --sweep": deploy("train", "--steps", "5", "--sweep", "learning_rate=0.1,0.01"),
        }
        for command, (code, out) in refused.items():
            assert code == 3, (command, out)
            assert f"job {record['run_id']}" in out and "still running" in out, (command, out)
            assert "`deploy.py cancel` stops it" in out, (command, out)
        assert len({out for _, out in refused.values()}) == 1, refused  # one way, word for word
        assert json.loads(state.read_text())["last_job"] == record
        assert set(running) <= set(processes_in(workdir))
        assert not list((Path("runs") / "local").glob("sweep-*")), "a refused sweep made a folder"

        code, out = deploy("exec", "--workdir", str(workdir), "--", "echo", "beside")
        assert code == 0, out
        assert all(f"{node} | beside" in out for node in ("pc-1", "pc-2", "pc-3")), out
        assert set(running) <= set(processes_in(workdir))
    finally:
        code, out = deploy("cancel")
    assert code == 0 and f"cancelled {record['run_id']}" in out, out


def _detach(
    workdir: Path, tfcluster_home: Path, chief_sleep: str = "600"
) -> tuple[Path, dict[str, Any]]:
    """`run --detach` of the stand-in job (its chief sleeps ``chief_sleep``
    seconds): the cluster's state file and the job's record in it."""
    code, out = deploy(
        "run", "--detach", "--workdir", str(workdir), "--env", f"CHIEF_SLEEP={chief_sleep}",
        "--", "python", "stand_in.py",
    )  # fmt: skip
    assert code == 0 and "started" in out, out
    state = tfcluster_home / "clusters" / "local" / "state.json"
    return state, json.loads(state.read_text())["last_job"]


def _wait(seconds: float, done: Callable[[], bool]) -> float | None:
    """Seconds until ``done()``, polled; None if not within ``seconds``."""
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        if done():
            return time.monotonic() - began
        time.sleep(0.1)
    return None


def _nodes_idle(tfcluster_home: Path) -> dict[str, bool]:
    """Each node's own idle check (autostop's, as a GCE node's watcher runs it)."""
    homes = tfcluster_home / "clusters" / "local" / "nodes"
    transport = LocalTransport(["pc-1", "pc-2", "pc-3"], homes)
    idle = {}
    for node in transport.nodes:
        report = transport.run(node, autostop_status(transport.layout(node))).stdout
        found = facts.parse_autostop(report)
        assert found is not None, report
        idle[node] = not found.busy
    return idle


@pytest.mark.parametrize("ending", ["exits", "is killed"])
def test_a_detached_jobs_tasks_end_with_its_chief(
    workdir: Path, tfcluster_home: Path, ending: str
) -> None:
    """`run --detach`, nobody attached: when the chief exits (or is killed
    with SIGKILL), the ps and workers, which would serve for ever, end
    within 10 s on every node by themselves, and every node's idle check
    says idle (autostop would stop it)."""
    _detach(workdir, tfcluster_home, chief_sleep="2" if ending == "exits" else "600")
    logs = tfcluster_home / "clusters" / "local" / "nodes" / "pc-1" / "tfcluster" / "logs"
    chief = int((logs / "chief-0.pid").read_text().split()[0])
    assert _wait(60, lambda: len(processes_in(workdir)) >= 4), processes_in(workdir)
    assert not any(_nodes_idle(tfcluster_home).values())
    if ending == "is killed":
        os.killpg(chief, signal.SIGKILL)
    assert _wait(60, lambda: not runs(chief)) is not None
    took = _wait(10, lambda: not processes_in(workdir))
    assert took is not None, f"still running 10 s after the chief ended: {processes_in(workdir)}"
    assert _nodes_idle(tfcluster_home) == {"pc-1": True, "pc-2": True, "pc-3": True}
    log = (logs.parents[2] / "pc-2" / "tfcluster" / "logs" / "worker-0.log").read_text()
    assert "tfcluster: the chief ended; stopping worker-0" in log


def test_ctrl_c_stops_every_task(workdir: Path, tfcluster_home: Path) -> None:
    env = {**os.environ, "TFCLUSTER_HOME": str(tfcluster_home), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "deploy.py"), "run", "--workdir", str(workdir),
         "--env", "CHIEF_SLEEP=600", "--", "python", "stand_in.py"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(processes_in(workdir)) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)  # the chief is started last: let it be followed
        assert len(processes_in(workdir)) >= 4
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, out
    assert "interrupted" in out and "Traceback" not in out
    # Recorded as a shell says a Ctrl-C, not as a chief without a code (-1).
    code, out = deploy("status")
    assert code == 0 and "(exit code 130: interrupted or cancelled)" in out, out


def test_exec_runs_in_the_working_folder_on_every_node(workdir: Path) -> None:
    code, out = deploy("up")
    assert code == 0, out
    code, out = deploy("exec", "--workdir", str(workdir), "--", "python", "-c",
                       "import os; print(sorted(os.listdir('.'))[0], os.getcwd())")  # fmt: skip
    assert code == 0, out
    for node in ("pc-1", "pc-2", "pc-3"):
        assert f"{node} | collective_program.py {workdir}" in out

    code, out = deploy("exec", "--workdir", str(workdir), "--node", "pc-2", "--", "sh", "-c", "echo no >&2; exit 3")
    assert code == 3, out
    assert "pc-2 | no" in out and "pc-1 |" not in out
    assert "error: failed on 1 of 1 node(s): pc-2 exit 3" in out

    code, out = deploy("exec", "--workdir", str(workdir), "--node", "pc-9", "--", "true")
    assert code == 2 and "pc-9 is not a node of local" in out
