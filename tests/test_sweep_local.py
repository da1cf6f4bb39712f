"""`deploy.py sweep` on the local cluster (real processes, two nodes), with a
trial program without TensorFlow (tests/programs/trial.py): the schedule
(at most nodes x per-node at once, from the times the trials recorded),
every result home, a failing trial among good ones, bad input, Ctrl-C, and
a node lost mid-sweep. After every test, no trial process is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from deploy import cli
from infra.errors import ConfigError
from infra.node import facts
from infra.sweeps.spec import command_spec, grid, parse_params, substitute, trainer_spec
from tests.procs import none_left_in, processes_in

REPO = Path(__file__).resolve().parents[1]
TRIAL = REPO / "tests" / "programs" / "trial.py"
RECORDED = REPO / "tests" / "recorded"


def deploy(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """A two-node local cluster.yaml beside the user's folder (a space in
    its name) holding the trial program. Afterwards nothing runs in it."""
    folder = tmp_path / "my project"
    folder.mkdir()
    (folder / "trial.py").write_text(TRIAL.read_text())
    (tmp_path / "two.yaml").write_text(
        "name: two\nprovider: local\nnodes: [pc-1, pc-2]\n"
        "roles: {chief: pc-1, worker: pc-2}\njob:\n  workdir: my project\n"
    )
    yield folder
    none_left_in(folder)


def sweep_folder(dest: Path) -> tuple[Path, dict[str, Any]]:
    (folder,) = [p for p in dest.iterdir() if p.name.startswith("sweep-")]
    return folder, json.loads((folder / "sweep.json").read_text())


def test_four_trials_two_nodes_at_most_two_at_once(project: Path, tmp_path: Path) -> None:
    dest = tmp_path / "results"
    hostile = "$(touch pwned);[red]x[/]"
    code, out = deploy(
        "--config", str(tmp_path / "two.yaml"), "sweep",
        "--param", "lr=0.1,0.2", "--param", f"name=a,{hostile}",
        "--env", "FAIL_TRIAL=2", "--env", "TRIAL_SLEEP=0.5", "--dest", str(dest),
        "--", "python", "trial.py", "--lr={lr}", "{name}",
        "bash", "-c", "echo {name}",
    )  # fmt: skip
    assert code == 1, out  # a trial failed: the sweep says so in its exit code
    assert "1 of 4 trial(s) failed: trial-2 (exit 3)" in out
    assert hostile in out  # shown as it is: markup off
    assert not (project / "pwned").exists()
    folder, data = sweep_folder(dest)
    trials = data["trials"]
    assert [t["state"] for t in trials] == ["done", "done", "failed", "done"]
    assert trials[2]["exit_code"] == 3
    records = {}
    for t in trials:
        # Every trial's run folder came home, the failed one's too.
        record = json.loads((folder / t["name"] / "trial.json").read_text())
        records[t["trial"]] = record
        assert record["tf_config"] is None  # one process, no cluster
        assert record["env"] == {"LR": t["params"]["lr"], "NAME": t["params"]["name"]}
        # The value is one word as it is; in `bash -c` text, its variable.
        assert record["argv"] == [
            f"--lr={t['params']['lr']}", t["params"]["name"], "bash", "-c", 'echo "${NAME}"',
        ]  # fmt: skip
    assert sorted(json.loads((folder / f"trial-{i}" / "summary.json").read_text())["score"]
                  for i in (0, 1, 3)) == [1.0, 1.0, 2.0]  # fmt: skip
    assert trials[0]["metrics"] == {"score": 1.0}
    assert {t["node"] for t in trials} == {"pc-1", "pc-2"}
    # At most two at once (2 nodes x 1): at any trial's start, how many ran.
    spans = [(r["started"], r["ended"]) for r in records.values()]
    at_once = max(sum(s <= start < e for s, e in spans) for start, _ in spans)
    assert at_once <= 2
    # ...and the two nodes were used together: two trials did overlap.
    assert at_once == 2
    # The report: a row per trial, the best finished one marked.
    code, out = deploy("report", str(folder), "--json")
    assert code == 0, out
    rows = json.loads(out)
    assert [r["best"] for r in rows] == [False, False, False, True]
    assert rows[3]["metrics"] == {"score": 2.0} and rows[2]["state"] == "failed"
    code, out = deploy("report", str(folder))
    assert code == 0, out
    assert "best: trial 3 (lr=0.2 name=" + hostile + "): score 2" in out
    assert (folder / "report.png").stat().st_size > 0


def test_per_node_runs_more_on_each_node(project: Path, tmp_path: Path) -> None:
    dest = tmp_path / "results"
    code, out = deploy(
        "--config", str(tmp_path / "two.yaml"), "sweep", "--param", "lr=1,2,3,4,5",
        "--trials", "4", "--per-node", "2", "--env", "TRIAL_SLEEP=0.3", "--dest", str(dest),
        "--", "python", "trial.py",
    )  # fmt: skip
    assert code == 0, out
    _, data = sweep_folder(dest)
    assert [t["params"]["lr"] for t in data["trials"]] == ["1", "2", "3", "4"]
    assert sorted(t["node"] for t in data["trials"]) == ["pc-1", "pc-1", "pc-2", "pc-2"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--param", "lr="], "--param lr: no value"),
        (["--param", "lr=1,,2"], "--param lr: no value"),
        (["--param", "lr"], "write NAME=V1,V2"),
        (["--param", "lr=1", "--param", "LR=2"], "given twice"),
        (["--param", "tfcluster_x=1"], "set by tfcluster"),
        (["--param", "lr=1", "--", "python", "trial.py", "{batch}"], "placeholder {batch}"),
        (["--param", "lr=1", "--per-node", "999"], "--per-node 999: pc-1 has"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    project: Path, tmp_path: Path, args: list[str], expected: str
) -> None:
    if "--" not in args:
        args = [*args, "--", "python", "trial.py"]
    code, out = deploy("--config", str(tmp_path / "two.yaml"), "sweep", *args)
    assert code == 2, out
    assert expected in out
    assert len(out.strip().splitlines()) == 1, out


def test_grid_and_substitution() -> None:
    params = parse_params(["a=1,2", "b=x,y,z"])
    assert grid(params) == [{"a": a, "b": b} for a in ("1", "2") for b in ("x", "y", "z")]
    assert grid(params, 2) == [{"a": "1", "b": "x"}, {"a": "1", "b": "y"}]
    assert substitute(["sh", "-c", "run {a}", "{a}{b}", "{c}"], {"a": "1 2", "b": "'"}) == (
        "sh", "-c", 'run "${A}"', "1 2'", "{c}",
    )  # fmt: skip


HOSTILE_VALUE = "$(echo INJECTED)\"; echo INJECTED; \" 'x' `echo INJECTED`"


@pytest.mark.parametrize(
    "argv",
    [
        ["bash", "-c", "echo {x}"],
        ["bash", "-lc", "echo {x}"],  # options in one word
        ["bash", "-e", "-c", "echo {x}"],  # -c not right before the script
        ["/usr/bin/env", "bash", "-o", "pipefail", "-c", "echo {x}"],
        ["bash", "-c", 'echo "{x}"'],  # in double quotes
        ["bash", "-c", 'echo "a b {x} c"'],
        ["bash", "-c", "cat <<EOF\n{x}\nEOF"],  # a heredoc expands $(...)
        ["bash", "-c", "echo $(echo {x})"],
    ],
)
def test_a_value_in_a_shell_script_is_never_code(argv: list[str]) -> None:
    """Shell-quoting a value as text was not enough: `bash -lc` or
    `bash -e -c` were not seen as scripts, and a placeholder the script
    had put in "..." or a heredoc ran the value's $(...). The value is now
    the trial's variable, which the shell expands but never runs."""
    words = substitute(argv, {"x": HOSTILE_VALUE})
    env = {**os.environ, "X": HOSTILE_VALUE}
    done = subprocess.run(words, capture_output=True, text=True, env=env, check=False)
    assert "INJECTED" not in done.stdout.replace("echo INJECTED", ""), (words, done.stdout)
    assert "$(echo INJECTED)" in done.stdout, (words, done.stdout)


def test_a_placeholder_in_single_quotes_of_a_script_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"\{x\} is inside '...'"):
        command_spec(["bash", "-c", "echo '{x}'"], parse_params(["x=1"]))
    with pytest.raises(ConfigError):
        parse_params(["1a=2"])


def test_cpu_count_parser_on_recorded_output() -> None:
    assert facts.parse_cpu_count((RECORDED / "cpus.txt").read_text()) == 2
    assert facts.parse_cpu_count((RECORDED / "cpus-unknown.txt").read_text()) is None


# -- Ctrl-C and a lost node: the sweep in its own process --------------------------


def start_sweep(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(REPO / "deploy.py"), "--config", str(tmp_path / "two.yaml"),
         "sweep", "--dest", str(tmp_path / "results"), *args],
        cwd=tmp_path, env={**os.environ, **env}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def wait_for(tmp_path: Path, proc: subprocess.Popen[str], ready: Any) -> dict[str, Any]:
    """sweep.json once ``ready(data)`` holds (the sweep still running)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        try:
            data = sweep_folder(tmp_path / "results")[1]
        except (ValueError, FileNotFoundError, json.JSONDecodeError):
            data = None
        if data is not None and ready(data):
            return data
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the sweep never got there")


def running_on(data: dict[str, Any]) -> dict[str, str]:
    return {t["node"]: t["name"] for t in data["trials"] if t["state"] == "running"}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_ctrl_c_stops_every_trial(project: Path, tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C, and as it `kill` (SIGTERM) and a closed terminal (SIGHUP),
    which once ended the sweep at once with its trials left running on the
    nodes, unknown to any `cancel`."""
    gate = tmp_path / "never"
    proc = start_sweep(
        tmp_path, "--param", "lr=1,2,3", "--env", f"TRIAL_GATE={gate}",
        "--", "python", "trial.py", env={},
    )  # fmt: skip
    wait_for(tmp_path, proc, lambda d: len(running_on(d)) == 2)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "every running trial was stopped" in out
    _, data = sweep_folder(tmp_path / "results")
    assert [t["state"] for t in data["trials"]] == ["stopped"] * 3
    # The table at the end lists every trial, the one still queued too.
    assert "stopped: never started (Ctrl-C)" in out, out
    assert out.count("stopped: stopped by Ctrl-C") == 2, out
    assert not processes_in(project)


def test_lost_node_requeues_its_trial_once(
    project: Path, tmp_path: Path, tfcluster_home: Path
) -> None:
    """pc-2 goes away mid-trial (its folder deleted, its processes killed,
    as a preempted VM): its trial runs again on pc-1, nothing more goes to
    pc-2, and every trial completes."""
    gate = tmp_path / "gate"
    proc = start_sweep(
        tmp_path, "--param", "lr=1,2,3", "--env", f"TRIAL_GATE={gate}",
        "--env", "TRIAL_SLEEP=0", "--", "python", "trial.py", env={},
    )  # fmt: skip
    data = wait_for(tmp_path, proc, lambda d: len(running_on(d)) == 2)
    lost = running_on(data)["pc-2"]
    home = tfcluster_home / "clusters" / "two" / "nodes" / "pc-2"
    pid = int((home / "tfcluster" / "logs" / f"{lost}.pid").read_text().split()[0])
    os.rename(home, tmp_path / "pc-2-gone")  # the node no longer answers
    os.killpg(pid, signal.SIGKILL)  # and its processes are gone with it
    gate.touch()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "node pc-2 lost mid-sweep" in out
    _, data = sweep_folder(tmp_path / "results")
    assert [t["state"] for t in data["trials"]] == ["done"] * 3
    again = next(t for t in data["trials"] if t["name"] == lost)
    assert again["attempts"] == 2 and again["node"] == "pc-1"
    assert again["lost_nodes"] == ["pc-2"]
    assert data["lost_nodes"] == ["pc-2"]
    assert [t["node"] for t in data["trials"]] == ["pc-1"] * 3  # none on pc-2 after
    assert (tmp_path / "results" / data["sweep_id"] / lost / "summary.json").is_file()


def lose_node(tfcluster_home: Path, tmp_path: Path, node: str, trial: str) -> None:
    """``node`` goes away as a preempted VM does: its folder (the node no
    longer answers) and ``trial``'s processes."""
    home = tfcluster_home / "clusters" / "two" / "nodes" / node
    pid = int((home / "tfcluster" / "logs" / f"{trial}.pid").read_text().split()[0])
    os.rename(home, tmp_path / f"{node}-gone")
    os.killpg(pid, signal.SIGKILL)


def test_a_trial_that_loses_its_node_twice_fails(
    project: Path, tmp_path: Path, tfcluster_home: Path
) -> None:
    proc = start_sweep(
        tmp_path, "--param", "lr=1", "--env", f"TRIAL_GATE={tmp_path / 'never'}",
        "--", "python", "trial.py", env={},
    )  # fmt: skip
    first = wait_for(tmp_path, proc, lambda d: running_on(d))
    (node,) = running_on(first)
    lose_node(tfcluster_home, tmp_path, node, "trial-0")
    other = wait_for(tmp_path, proc, lambda d: running_on(d) and node not in running_on(d))
    (node2,) = running_on(other)
    lose_node(tfcluster_home, tmp_path, node2, "trial-0")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "trial-0 (its node was lost 2 times)" in out
    _, data = sweep_folder(tmp_path / "results")
    (trial,) = data["trials"]
    assert trial["state"] == "failed" and trial["attempts"] == 2
    assert trial["lost_nodes"] == [node, node2]


def test_a_metric_past_floats_range_is_not_the_trials_end(project: Path, tmp_path: Path) -> None:
    """A trial's metric line with a 400-digit integer (valid JSON) once
    ended the thread following the trial: the trial, still running, was
    recorded as failed and left behind on its node. It is data like any
    other: the trial is followed to its real end."""
    (project / "loud.py").write_text(
        "import time\n"
        f"print('@tfcluster {{\"event\": \"metrics\", \"big\": {'1' * 400}, \"ok\": 2}}', flush=True)\n"
        "time.sleep(2)\n"
        "print('@tfcluster {\"event\": \"metrics\", \"ok\": 3}', flush=True)\n"
    )
    dest = tmp_path / "results"
    code, out = deploy(
        "--config", str(tmp_path / "two.yaml"), "sweep", "--param", "seed=1",
        "--dest", str(dest), "--", "python", "loud.py",
    )  # fmt: skip
    assert code == 0, out
    _, data = sweep_folder(dest)
    (trial,) = data["trials"]
    assert (trial["state"], trial["exit_code"]) == ("done", 0), trial
    assert trial["metrics"] == {"ok": 3.0}


@pytest.mark.parametrize("name", ["mixed_precision", "require_gpu", "eval"])
def test_a_trainer_switch_is_not_swept(name: str) -> None:
    """`--sweep mixed_precision=1,0` gave `--mixed-precision 1` (the trainer
    refuses it), and removing a fixed `--mixed-precision` with "its value"
    took `--steps` from the next flag. Refused before anything runs."""
    base = ["python", "-m", "trainer", "--mixed-precision", "--steps", "100"]
    with pytest.raises(ConfigError, match="is a switch"):
        trainer_spec(base, parse_params([f"{name}=1,0"]))
    spec = trainer_spec(base, parse_params(["learning_rate=0.1"]))
    assert spec.command(spec.points[0])[3:] == (
        "--mixed-precision", "--steps", "100", "--learning-rate", "0.1",
    )  # fmt: skip


@pytest.mark.timeout(60)  # followed, the copy never ends
def test_symlinks_in_a_local_run_folder_are_not_followed(tmp_path: Path) -> None:
    """The local fetch followed symlinks: a run folder holding `a -> .`
    and `b -> .` was copied without end (2^40 folders), `data -> /` was the
    whole disk. They come home as the symlinks they are."""
    from infra.providers.local import LocalTransport

    homes = tmp_path / "nodes"
    run = homes / "pc-1" / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    for name in ("a", "b"):
        (run / name).symlink_to(".")
    (run / "data").symlink_to("/")
    dest = tmp_path / "home"
    LocalTransport(["pc-1"], homes).fetch("pc-1", "runs/r1", dest)
    assert sorted(p.name for p in dest.iterdir()) == ["a", "b", "data", "summary.json"]
    assert all((dest / n).is_symlink() for n in ("a", "b", "data"))


def test_a_huge_grid_is_refused_and_trials_takes_its_start() -> None:
    """8 parameters of 10 values: 10^8 points, built whole even for
    --trials 3 (MemoryError). The first N are taken as they come; a sweep
    of more than MAX_TRIALS is refused in one line."""
    params = parse_params([f"p{i}=" + ",".join(map(str, range(10))) for i in range(8)])
    spec = command_spec(["true"], params, trials=3)
    assert [p["p7"] for p in spec.points] == ["0", "1", "2"]
    with pytest.raises(ConfigError, match="100000000 combinations"):
        command_spec(["true"], params)


def test_sweeps_begun_in_the_same_second_have_their_own_folders() -> None:
    # The id was `sweep-<time to the second>`: a second sweep begun in the
    # same second wrote into the first one's folders.
    params = parse_params(["a=1"])
    ids = {command_spec(["true"], params).sweep_id for _ in range(20)}
    assert len(ids) == 20
