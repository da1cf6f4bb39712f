"""deploy.py on the local provider: lifecycle, errors, and a real job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from deploy import cli
from tests.procs import runs


def run(*args: str, input: str | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)
    return result.exit_code, result.output


def test_up_status_down_cycle(tfcluster_home: Path) -> None:
    code, out = run("status", "--json")
    assert code == 0
    assert [n["state"] for n in json.loads(out)] == ["absent"] * 3

    code, out = run("up", "--dry-run")
    assert code == 0 and "create  pc-1" in out
    assert not (tfcluster_home / "clusters" / "local" / "nodes").exists()

    code, out = run("up")
    assert code == 0 and "local is up" in out
    code, out = run("up")
    assert code == 0 and "nothing to do" in out

    nodes = json.loads(run("status", "--json")[1])
    assert [(n["name"], n["state"], n["roles"]) for n in nodes] == [
        ("pc-1", "running", ["ps", "chief"]),
        ("pc-2", "running", ["worker"]),
        ("pc-3", "running", ["worker"]),
    ]
    assert all(n["internal_ip"] == "127.0.0.1" for n in nodes)

    code, out = run("down")  # asks first; "n" keeps everything
    assert code == 1
    assert len(json.loads(run("status", "--json")[1])) == 3
    assert all(n["state"] == "running" for n in json.loads(run("status", "--json")[1]))

    code, out = run("down", "--yes")
    assert code == 0 and "deleted local" in out
    assert all(n["state"] == "absent" for n in json.loads(run("status", "--json")[1]))


def test_expected_errors_are_one_line_with_their_exit_code(tmp_path: Path) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("name: x\ngce:\n  zonse: [us-central1-a]\n")
    code, out = run("--config", str(bad), "status")
    assert code == 2
    assert out.strip() == f"error: {bad}: gce.zonse: unknown key; did you mean 'zones'?"

    code, out = run("--config", str(tmp_path / "missing.yaml"), "up")
    assert code == 2 and "no such file" in out and "Traceback" not in out

    code, out = run("stop")
    assert code == 3 and "stopping them saves nothing" in out

    code, out = run("train", "--resume")
    assert code == 3 and "nothing to resume" in out

    code, out = run("fetch")
    assert code == 3 and "no job to fetch" in out

    code, out = run("logs", "pc-9")
    assert code == 2 and "not a node of local" in out


@pytest.mark.parametrize("flag", [["--steps", "0"], ["--mode", "ring"], ["--model", "resnet"]])
def test_bad_flags_exit_2(flag: list[str]) -> None:
    code, out = run("train", *flag)
    assert code == 2 and "Traceback" not in out


def test_train_on_the_local_cluster_then_report(
    tmp_path: Path, mnist_dir: Path, monkeypatch: pytest.MonkeyPatch, tfcluster_home: Path
) -> None:
    """What `make demo` does, shortened: a real async job (ps + 2 workers +
    chief as processes), results brought to --dest, then `report` on them."""
    monkeypatch.setenv("MNIST_DIR", str(mnist_dir))
    dest = tmp_path / "runs"
    code, out = run("train", "--steps", "40", "--checkpoint-every", "20", "--dest", str(dest))
    assert code == 0, out
    assert "ps-0@pc-1" in out and "worker-1@pc-3" in out and "chief-0@pc-1" in out
    (run_dir,) = list(dest.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mode"] == "async" and summary["workers"] == 2 and summary["steps"] == 40
    # Far above chance (0.1), where a model that never updates would stay;
    # 40 steps of 128 examples take the CNN well past this bar.
    assert 0.3 <= summary["test_accuracy"] <= 1.0, summary
    assert summary["final_loss"] < 2.0, summary  # ln(10) = 2.30 is a uniform guess
    # One row per logged step, none a repeat with a rate of 0 examples/s,
    # the last at the last step; every step applied counted by Adam too.
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [x["step"] for x in rows]
    assert steps == sorted(set(steps)) and steps[-1] == 40, rows
    assert all(x["examples_per_sec"] > 0 for x in rows), rows
    assert summary["optimizer_iterations"] == {"train": 40}
    # The start-up in stages: the orchestrator's (told to the chief), the
    # chief's own; shown as they came, and in summary.json.
    startup = summary["startup_s"]
    stages = ["start_tasks", "launch", "tensorflow", "ready", "build", "first_step"]
    assert set(startup) == {*stages, "total"}, startup
    assert abs(startup["total"] - sum(startup[k] for k in stages)) < 0.01
    assert "startup: tasks started" in out and "startup: TensorFlow imported" in out
    assert f"startup: first step {startup['first_step']:.1f} s, {startup['total']:.1f} s" in out
    # The ps and workers were stopped when the chief ended: no task is left.
    pid_files = list(tfcluster_home.glob("clusters/local/nodes/*/tfcluster/logs/*.pid"))
    assert len(pid_files) == 4
    assert not [p for p in pid_files if runs(int(p.read_text().split()[0]))]
    code, out = run("report", str(run_dir), "--plot", str(tmp_path / "r.png"), "--json")
    assert code == 0
    rows = json.loads(out)
    assert rows[0]["model"] == "cnn" and rows[0]["steps"] == 40
    assert (tmp_path / "r.png").stat().st_size > 0
