"""What a new user sees, reads and types in the first minutes (issue 12):
output that is not cut when piped, --version, completion, help in a
cluster's order with the effective defaults, where trainer flags go,
`logs` in sentences, what `down` says per provider, `up --dry-run` without
credentials, per-node cost, the report's note on speedup. Every command
runs through click's CliRunner, whose output is no terminal (as in a pipe
or in CI), or as a real process."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from deploy import COMPLETE_VAR, cli
from infra.cluster.api import Cluster
from infra.config.loader import parse_config
from infra.node.facts import tensorboard_port
from infra.reports.compare import compute_rows, load_runs, plot_figure
from infra.transport.base import free_local_port, wanted_local_port
from tests.fake_gce import FakeGce
from tests.procs import processes_in

pytest_plugins = ["tests.fake_gce.fixtures"]

REPO = Path(__file__).resolve().parents[1]
STAND_IN = REPO / "tests" / "programs" / "stand_in.py"
RECORDED = REPO / "tests" / "recorded"


def run(*args: str, input: str | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, list(args), input=input, catch_exceptions=False, prog_name="deploy.py"
    )
    return result.exit_code, result.output


def write_yaml(path: Path, mapping: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump(mapping))
    return path


def gce_mapping(**gce: object) -> dict[str, object]:
    """A 4-node gce cluster whose credentials file does not exist."""
    return {
        "name": "tfc-test", "provider": "gce", "nodes": ["pc-1", "pc-2", "pc-3", "pc-4"],
        "roles": {"ps": "pc-1", "chief": "pc-1", "worker": ["pc-2", "pc-3", "pc-4"]},
        "gce": {"project": "p", "zones": ["us-central1-a", "us-central1-b"],
                "api_endpoint": "http://127.0.0.1:9", **gce},
    }  # fmt: skip


# -- the command line itself ---------------------------------------------------------------


def test_version() -> None:
    code, out = run("--version")
    assert code == 0
    name, version = out.split()
    assert name == "tfcluster" and version[0].isdigit(), out


def test_commands_are_listed_in_the_order_of_a_clusters_life() -> None:
    code, out = run("--help")
    assert code == 0
    listed = [
        line.split()[0]
        for line in out.split("Commands:", 1)[1].splitlines()
        if line.startswith("  ") and line.split()
    ]
    order = ["up", "status", "train", "run", "logs", "tensorboard", "fetch", "report"]
    order += ["stop", "start", "down", "forget-host"]
    assert [c for c in listed if c in order] == order, listed


def test_completion_answers_for_deploy_py_and_tfcluster() -> None:
    """The variable is the same whatever the program's name, so that
    completion also works for `./deploy.py` (click would want
    `_DEPLOY.PY_COMPLETE`, which no shell can set)."""
    env = {**os.environ, COMPLETE_VAR: "bash_complete", "COMP_WORDS": "deploy.py st",
           "COMP_CWORD": "1"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "deploy.py"], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == {"plain,status", "plain,stop", "plain,start"}
    source = subprocess.run(
        [sys.executable, "deploy.py"], cwd=REPO, env={**os.environ, COMPLETE_VAR: "bash_source"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "complete -o nosort -F" in source.stdout and "deploy.py" in source.stdout


def test_train_help_shows_the_defaults_of_the_cluster_yaml_in_use(tmp_path: Path) -> None:
    code, out = run("train", "--help")
    assert code == 0
    assert "[default: 400, from job.steps]" in " ".join(out.split())  # the embedded local cluster
    config = write_yaml(tmp_path / "c.yaml", {
        "name": "mine", "nodes": ["a", "b"],
        "roles": {"ps": "a", "chief": "a", "worker": "b"},
        "job": {"steps": 123, "mode": "sync", "batch_size": 64},
    })  # fmt: skip
    code, out = run("--config", str(config), "train", "--help")
    flat = " ".join(out.split())
    assert code == 0
    for shown in ("[default: 123, from job.steps]", "[default: sync, from job.mode]",
                  "[default: 64, from job.batch_size]",
                  "[default: the model's own, from job.learning_rate]"):  # fmt: skip
        assert shown in flat, out


@pytest.mark.parametrize(
    ("command", "hint"),
    [
        (["train", "--epochs", "1"], "trainer flags go after --, e.g. `deploy.py train -- --epochs"),
        (["run", "--epochs", "1", "--", "python", "x.py"],
         "your program's flags go after the command: `deploy.py run -- python prog.py --epochs"),
    ],
)  # fmt: skip
def test_an_unknown_option_of_train_or_run_says_where_program_flags_go(
    command: list[str], hint: str
) -> None:
    code, out = run(*command)
    assert code == 2
    assert out.count("\n") == 1 and out.startswith("error: ") and hint in out, out
    # Elsewhere an unknown option is just that.
    code, out = run("status", "--epochs", "1")
    assert code == 2 and "go after" not in out


def test_trainer_epochs_after_the_double_dash_replaces_the_steps() -> None:
    cluster = Cluster(parse_config(yaml.safe_load("name: x"), source="t"))
    argv = cluster.train_spec(extra_args=("--epochs", "1")).program.argv
    assert "--steps" not in argv and argv[-2:] == ("--epochs", "1")
    assert "--steps" in cluster.train_spec().program.argv
    with pytest.raises(Exception, match="--steps and the trainer flag --epochs"):
        cluster.train_spec(steps=5, extra_args=("--epochs=1",))


# -- output is whole when it is no terminal ------------------------------------------------


def test_piped_output_is_never_wrapped_or_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job line, the results path, fetch's path and report's run ids,
    each far longer than 80 columns, come out whole, one line each."""
    monkeypatch.delenv("COLUMNS", raising=False)
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "stand_in.py").write_bytes(STAND_IN.read_bytes())
    long_arg = "--a-very-long-flag-of-the-users-program=" + "x" * 120
    dest = tmp_path / ("a-results-folder-with-a-long-name-" + "y" * 90)
    assert run("up")[0] == 0
    code, out = run("run", "--workdir", str(workdir), "--dest", str(dest), "--",
                    "python", "stand_in.py", long_arg)  # fmt: skip
    assert code == 0, out
    job_line = next(line for line in out.splitlines() if line.startswith("job "))
    assert long_arg in job_line and job_line.endswith("chief-0@pc-1"), out
    (run_dir,) = dest.iterdir()
    assert f"results: {run_dir}\n" in out
    code, out = run("fetch", "--dest", str(dest))
    assert code == 0 and out == f"fetched {run_dir.name} to {run_dir}\n", out

    long_run = tmp_path / ("cnn-async-" + "z" * 100)
    long_run.mkdir()
    (long_run / "summary.json").write_text(json.dumps({
        "model": "cnn", "mode": "async", "workers": 2, "ps": 1, "steps": 10,
        "training_seconds": 1.0, "examples_per_sec": 10.0, "test_accuracy": 0.5,
    }))  # fmt: skip
    code, out = run("report", str(long_run), "--plot", str(tmp_path / "r.png"))
    assert code == 0, out
    assert f" {long_run.name} " in out and "…" not in out, out


# -- logs ------------------------------------------------------------------------------------


PROGRESS = '@tfcluster {"event": "progress", "step": 5, "total_steps": 10, "loss": 0.5, "examples_per_sec": 100}'


def test_logs_before_any_job_say_so(tfcluster_home: Path) -> None:
    code, out = run("logs")
    assert code == 3 and out.startswith("error: no job has run on local yet"), out
    assert run("up")[0] == 0
    code, out = run("logs")
    assert code == 3 and out.count("\n") == 1 and "`deploy.py train`" in out, out


def test_logs_show_progress_events_as_sentences_and_raw_on_request(tfcluster_home: Path) -> None:
    assert run("up")[0] == 0
    logs = tfcluster_home / "clusters" / "local" / "nodes" / "pc-1" / "tfcluster" / "logs"
    logs.mkdir(parents=True)
    (logs / "chief-0.log").write_text(f"plain text\n{PROGRESS}\n")
    code, out = run("logs")
    assert code == 0, out
    assert "pc-1/chief-0 plain text\n" in out
    assert "pc-1/chief-0 step 5/10 loss 0.5000 100 ex/s\n" in out and "@tfcluster" not in out
    code, out = run("logs", "--raw")
    assert code == 0 and f"pc-1/chief-0 {PROGRESS}\n" in out, out


# -- down: what each provider says -------------------------------------------------------------


def ssh_cluster(tmp_path: Path) -> Path:
    """Provider ssh whose hosts do not answer (a port nothing listens on):
    `down` lists them all the same."""
    port = free_local_port()
    return write_yaml(tmp_path / "ssh.yaml", {
        "name": "hosts", "provider": "ssh", "nodes": ["h1", "h2"],
        "roles": {"ps": "h1", "chief": "h1", "worker": "h2"},
        "hosts": {"h1": f"127.0.0.1:{port}", "h2": f"127.0.0.1:{port}"},
    })  # fmt: skip


def test_down_on_provider_ssh_never_says_delete(tmp_path: Path) -> None:
    config = ssh_cluster(tmp_path)
    code, out = run("--config", str(config), "down", "--dry-run")
    assert code == 0, out
    assert "release h1" in out and "release h2" in out
    assert "delete" not in out.lower(), out
    code, out = run("--config", str(config), "down", input="n\n")
    assert code == 1, out
    assert "stop tfcluster's tasks on these hosts (the machines and their files stay)?" in out
    assert out.rstrip().endswith("cancelled: nothing changed") and "delete" not in out.lower()


def test_answering_no_at_down_says_cancelled_and_exits_1() -> None:
    assert run("up")[0] == 0
    code, out = run("down", input="n\n")
    assert code == 1
    assert "delete  pc-1" in out and "delete these, with their disks? [y/N]: n" in out
    assert out.rstrip().endswith("cancelled: nothing changed"), out
    assert all(n["state"] == "running" for n in json.loads(run("status", "--json")[1]))


# -- up --dry-run and status on gce: machine, zone, cost ---------------------------------------


def test_up_dry_run_on_gce_needs_no_credentials(tmp_path: Path) -> None:
    mapping = gce_mapping(credentials=str(tmp_path / "none.json"))
    config = write_yaml(tmp_path / "gce.yaml", mapping)
    code, out = run("--config", str(config), "up", "--dry-run")
    assert code == 0, out
    assert "existing nodes not listed: gce.credentials:" in out and "none.json does not exist" in out
    for node in ("pc-1", "pc-2", "pc-3", "pc-4"):
        line = f"  create  {node} (e2-standard-2, 20 GB pd-balanced, zone us-central1-a, else us-central1-b)\n"
        assert line in out, out
    # 4 x e2-standard-2 with an external IP and 20 GB pd-balanced each.
    assert "estimated cost once up: $0.299/hour for 4 node(s) while running" in out, out
    assert "(us-central1 list prices as of 20" in out
    # Without --dry-run the missing credentials are the error they are.
    code, out = run("--config", str(config), "up")
    assert code == 6 and "none.json does not exist" in out


def test_up_dry_run_prices_spot_gpu_nodes(tmp_path: Path) -> None:
    mapping = gce_mapping(
        credentials=str(tmp_path / "none.json"), preemptible=True,
        machine_type="n1-standard-4", accelerator={"type": "nvidia-tesla-t4", "count": 1},
        # An image with the NVIDIA driver: a stock Debian one is refused for GPUs.
        image="projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11",
    )  # fmt: skip
    code, out = run("--config", str(write_yaml(tmp_path / "g.yaml", mapping)), "up", "--dry-run")
    assert code == 0, out
    assert "create  pc-1 (n1-standard-4, 1 x nvidia-tesla-t4, spot, 20 GB pd-balanced" in out
    assert "estimated cost once up: $" in out


def test_status_on_gce_shows_each_nodes_cost_and_the_price_table(
    fake_gce: FakeGce, gce_cluster_yaml: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = gce_cluster_yaml()  # type: ignore[operator]
    assert run("--config", str(config), "up", "--skip-setup")[0] == 0
    code, out = run("--config", str(config), "status")
    assert code == 0, out
    assert "$/hour" in out
    rows = [line for line in out.splitlines() if "pc-" in line]
    assert len(rows) == 4 and all(line.rstrip(" │").endswith("0.075") for line in rows), out
    assert "estimated cost now: $0.299/hour (us-central1 list prices as of 20" in out
    run("--config", str(config), "down", "--yes")


# -- report and loss.png ---------------------------------------------------------------------


def test_report_says_why_there_is_no_speedup(tmp_path: Path) -> None:
    run_dir = tmp_path / "cnn-2"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({
        "model": "cnn", "mode": "async", "workers": 2, "ps": 1, "steps": 10,
        "training_seconds": 1.0, "examples_per_sec": 10.0,
    }))  # fmt: skip
    code, out = run("report", str(run_dir), "--plot", str(tmp_path / "r.png"))
    assert code == 0, out
    assert "no speedup for cnn: it needs a 1-worker run of the same model" in out
    fig = plot_figure(load_runs([str(run_dir)]))
    assert any("1-worker run" in t.get_text() for t in fig.axes[0].texts)
    assert compute_rows(load_runs([str(run_dir)]))[0].speedup is None


def test_loss_plot_marks_the_final_test_accuracy() -> None:
    from trainer.loop.outputs import loss_figure

    lines = [{"step": s, "loss": 1.0 / s, "accuracy": 0.5 + s / 40} for s in (1, 10, 20)]
    fig = loss_figure(lines, "cnn (async)", {"test_accuracy": 0.9712})
    texts = [t.get_text() for t in fig.axes[1].texts]
    assert texts == ["test accuracy 0.9712"]
    marked = [line for line in fig.axes[1].lines if line.get_label() == "test accuracy 0.9712"]
    # asarray: the stubs' ArrayLike (a scalar too) for what is an ndarray here.
    assert len(marked) == 1 and list(np.asarray(marked[0].get_xdata())) == [20]
    assert list(np.asarray(marked[0].get_ydata())) == [0.9712]
    assert not loss_figure(lines, "x").axes[1].texts  # no summary: no mark


# -- tensorboard -------------------------------------------------------------------------------


def test_tensorboard_port_is_read_from_its_log() -> None:
    assert tensorboard_port((RECORDED / "tensorboard-start.txt").read_text()) == 33337
    assert tensorboard_port("NOTE: Using experimental fast data loading logic.\n") is None
    assert tensorboard_port("TensorBoard 2.21.0 at http://127.0.0.1:99999/ (Press") is None


def _tensorboards(home: Path) -> list[int]:
    """Pids of the TensorBoard processes of this test's local cluster (run
    in its nodes' folders, under ``home``): not another test session's,
    nor one in a container, which /proc shows too."""
    found = []
    for pid in processes_in(home):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"tensorboard.main" in cmdline:
            found.append(pid)
    return found


def test_tensorboard_answers_http_on_the_local_cluster(tmp_path: Path, tfcluster_home: Path) -> None:
    """`deploy.py tensorboard` as a user runs it: a real process on the
    port asked for, the URL it prints answers HTTP with the job's run
    folder, Ctrl-C (SIGINT) closes it (exit 130) and no TensorBoard is
    left running."""
    pytest.importorskip("tensorboard", reason="tensorboard (trainer/requirements.txt) not installed")
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "stand_in.py").write_bytes(STAND_IN.read_bytes())
    assert run("up")[0] == 0
    code, out = run("run", "--workdir", str(workdir), "--dest", str(tmp_path / "runs"), "--",
                    "python", "stand_in.py")  # fmt: skip
    assert code == 0, out
    run_id = out.split("job ", 1)[1].split(":", 1)[0]  # after the start-up lines
    before = set(_tensorboards(tfcluster_home))
    port = free_local_port()
    proc = subprocess.Popen(
        [sys.executable, "deploy.py", "tensorboard", "--port", str(port)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout or ():
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 240
        while not any(" at http://" in line for line in seen):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(seen)
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=1))
        url = seen[-1].split(" at ", 1)[1].split()[0]
        assert url == f"http://127.0.0.1:{port}/", url  # the port asked for, not one of TB's
        with urllib.request.urlopen(url + "data/logdir", timeout=30) as answer:
            logdir = json.loads(answer.read())["logdir"]
        assert logdir.endswith(f"runs/{run_id}"), logdir
        assert set(_tensorboards(tfcluster_home)) - before
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    rest = "".join(seen) + "".join(lines.get() for _ in range(lines.qsize()))
    assert code == 130 and "closed TensorBoard" in rest, rest
    assert not set(_tensorboards(tfcluster_home)) - before


def test_a_tensorboard_port_asked_for_and_taken_is_refused_in_one_line() -> None:
    """Before anything starts (exit 2); the default 6006 taken is any free port instead."""
    assert run("up")[0] == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = run("tensorboard", "--port", str(port))
        assert code == 2 and out.count("\n") == 1, out
        assert f"--port {port}: that port is taken on this machine" in out, out
        assert wanted_local_port(port, exact=False) != port
        assert wanted_local_port(0, exact=True) > 0


# -- dependencies: ranges for the operator, exact pins as constraints --------------------------


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"{path.name}: {line!r} is not an exact pin"
            pins[_canonical(name)] = version
    return pins


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def test_pyproject_asks_compatible_ranges_whose_floor_is_the_tested_pin() -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    constraints = _pins(REPO / "constraints.txt")
    for requirement in project["dependencies"]:
        name, _, spec = requirement.partition(">=")
        floor, _, ceiling = spec.partition(",<")
        assert floor and ceiling, f"{requirement}: write >=tested,<next major"
        assert constraints[_canonical(name)] == floor, requirement
        assert int(ceiling) == int(floor.split(".")[0]) + 1, requirement
    # The trainer's pins (the nodes' requirements) are the tested versions.
    for name, version in _pins(REPO / "trainer" / "requirements.txt").items():
        assert constraints[name] == version, name
    for name, version in _pins(REPO / "requirements-dev.txt").items():
        assert constraints[name] == version, name
    assert "-c constraints.txt" in (REPO / "Makefile").read_text()


def test_nodes_install_the_default_requirements_with_the_constraints(tmp_path: Path) -> None:
    from infra.setup.commands import install_command
    from infra.setup.nodes import install_plan
    from infra.transport.base import NodeLayout

    layout = NodeLayout(root="tf", code="tf/code", python="tf/venv/bin/python", runs="tf/runs",
                        logs="tf/logs")  # fmt: skip
    plan = install_plan(parse_config({"name": "x"}, source="t"))
    assert plan.constraints == (REPO / "constraints.txt").read_text()
    script = install_command(layout, plan, None)
    assert '-r "$H"/tf/requirements.txt -c "$H"/tf/constraints.txt' in script
    assert "tensorboard==2.21.0" in script
    # A user's own requirements are installed as they are: their pins may differ.
    own = tmp_path / "reqs.txt"
    own.write_text("tensorflow-cpu==2.20.0\n")
    (tmp_path / "c.yaml").write_text(f"name: x\nsetup:\n  requirements: {own}\n")
    from infra.config.loader import load_config

    assert install_plan(load_config(tmp_path / "c.yaml")).constraints == ""


@pytest.mark.parametrize("hostile", ["../../etc", "x; rm -rf ~", "[red]x[/]", "a/b"])
def test_tensorboard_refuses_a_run_that_is_no_run_id(hostile: str) -> None:
    assert run("up")[0] == 0
    code, out = run("tensorboard", hostile)
    assert code == 2 and out.count("\n") == 1 and "is not a run id" in out, out
    assert hostile in out  # shown as it is: data, never markup


def test_tensorboard_before_any_job_says_so() -> None:
    code, out = run("tensorboard")
    assert code == 3 and "no job has run on local yet" in out, out


@pytest.mark.timeout(240)  # without the lock, the second one serves until stopped
def test_a_second_tensorboard_leaves_the_first_one_running(tmp_path: Path) -> None:
    """Two `deploy.py tensorboard` at once on one cluster (two terminals):
    the second used to stop the first one's TensorBoard (the same task
    name) under it, leaving a dead URL. It is refused in one line, and the
    first one's task (here a stand-in process under TensorBoard's task
    name, its command's lock held as that command holds it) runs on."""
    from infra.cluster.api import Cluster
    from infra.config.loader import default_config
    from infra.jobs import tensorboard
    from infra.node import commands
    from infra.state.lock import ClusterLock

    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "stand_in.py").write_bytes(STAND_IN.read_bytes())
    assert run("up")[0] == 0
    code, out = run("run", "--workdir", str(workdir), "--dest", str(tmp_path / "runs"), "--",
                    "python", "stand_in.py")  # fmt: skip
    assert code == 0, out
    cluster = Cluster(default_config())
    node = cluster.config.roles.chief[0]
    with cluster.provider.transport(cluster.nodes()) as transport:
        layout = tensorboard.board_layout(transport.layout(node))
        started = transport.run(
            node, commands.start_task(layout, tensorboard.TASK, ["sleep", "300"], env={})
        )
        assert started.ok, started.stderr
        first = ClusterLock(cluster.state.dir / "tensorboard.lock", cluster.config.name)
        try:
            with first.hold("tensorboard", wait=0):
                code, out = run("tensorboard", "--port", "0")
            assert code == 3 and "TensorBoard is already open" in out, out
            assert out.count("\n") == 2, out  # the line and its hint
            assert tensorboard.TensorBoardTask(transport, node, "-").alive()
        finally:
            transport.run(node, commands.stop_tasks(layout, [tensorboard.TASK]))


def test_an_argument_that_is_not_utf8_is_one_line() -> None:
    """Non-UTF-8 bytes reach Python as surrogates, which the SSH library
    cannot send: a sweep or run over SSH ended in a traceback. Refused
    before anything runs, controls left out of the line."""
    done = subprocess.run(
        [sys.executable, b"deploy.py", b"sweep", b"--param", b"x=\xff\x1b[2J", b"--", b"true"],
        cwd=REPO, capture_output=True, check=False,
    )  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "argument 3 (x=\\xff) is not UTF-8 text" in err and "\x1b" not in err, err
