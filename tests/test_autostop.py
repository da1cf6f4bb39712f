"""Autostop (infra/cluster/autostop.py): durations, bad input, the provider's say,
the parser on recorded node output, and the watcher's idle decision run for
real (bash, real task processes) with its poweroff caught by a stand-in
``sudo``. The docker e2e (tests/docker/test_cost_e2e.py) powers real nodes
off."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from deploy import cli
from infra.cluster import autostop
from infra.cluster.autostop import ClusterIdle, summarize
from infra.config.durations import DurationError, format_duration, parse_duration
from infra.config.loader import ClusterConfig
from infra.node import autostop_commands, commands, facts
from infra.node.autostop_commands import BUSY_LEASE_S
from infra.node.commands import board_layout
from infra.providers.local import LocalTransport
from infra.transport.base import NodeLayout
from tests.fake_gce import FakeGce

pytest_plugins = ["tests.fake_gce.fixtures"]

RECORDED = Path(__file__).parent / "recorded"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("45s", 45), ("30m", 1800), ("2h", 7200), ("1h30m", 5400), (" 90S ", 90), ("1d", 86400)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize("off", ["off", "OFF", None, False, "none"])
def test_off(off: object) -> None:
    assert parse_duration(off) is None
    assert format_duration(None) == "off"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0", "longer than 0"),
        (0, "longer than 0"),
        ("0s", "longer than 0"),
        ("-5m", "longer than 0"),
        (-3, "longer than 0"),
        ("30", "no unit"),
        (30, "no unit"),
        ("soon", "not a duration"),
        ("5 m", "not a duration"),
        ("1m-", "not a duration"),
        (True, "not a duration"),
        ([1], "not a duration"),
        ("10s", "too short"),
    ],
)
def test_bad_durations(value: object, says: str) -> None:
    with pytest.raises(DurationError, match=says):
        parse_duration(value)


def invoke(args: list[str], home: Path) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, args, catch_exceptions=False, env={"TFCLUSTER_HOME": str(home), "COLUMNS": "300"}
    )
    return result.exit_code, result.output


def one_error_line(out: str) -> str:
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    return lines[0]


@pytest.mark.parametrize("value", ["0", "-5m", "abc", "30"])
def test_bad_autostop_in_cluster_yaml_is_exit_2(value: str, tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(f"name: x\nautostop: {value}\n")
    code, out = invoke(["--config", str(config), "status"], tmp_path)
    assert code == 2, out
    assert "autostop" in one_error_line(out)


@pytest.mark.parametrize("value", ["0", "-1h", "later", "5"])
def test_bad_autostop_on_the_command_line_is_exit_2(value: str, tmp_path: Path) -> None:
    # (click reads -1h as an option: its own one line, the same exit code)
    code, out = invoke(["autostop", value], tmp_path)
    assert code == 2, out
    assert "autostop" in one_error_line(out)
    code, out = invoke(["up", f"--autostop={value}", "--dry-run"], tmp_path)
    assert code == 2, out
    assert one_error_line(out).startswith("error: --autostop: ")


def test_local_and_ssh_refuse_autostop_with_why(tmp_path: Path) -> None:
    code, out = invoke(["autostop", "30m"], tmp_path)  # the embedded local cluster
    assert code == 2 and "provider local" in one_error_line(out), out
    config = tmp_path / "ssh.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "mine",
                "provider": "ssh",
                "nodes": ["a"],
                "roles": {"chief": "a", "ps": [], "worker": []},
                "job": {"mode": "single"},
                "hosts": {"a": "127.0.0.1:65000"},
            }
        )
    )
    code, out = invoke(["--config", str(config), "autostop", "1h"], tmp_path)
    assert code == 2 and "not ours to power off" in one_error_line(out), out
    # Turning it off is nothing to refuse; setting it at `up` is.
    code, out = invoke(["--config", str(config), "up", "--autostop", "1h"], tmp_path)
    assert code == 2 and "not ours to power off" in one_error_line(out), out


def test_autostop_on_a_gce_cluster_not_up_is_exit_3(
    gce_cluster_yaml: Callable[..., Path], tmp_path: Path
) -> None:
    code, out = invoke(["--config", str(gce_cluster_yaml()), "autostop", "30m"], tmp_path)
    assert code == 3, out
    assert "is not up" in one_error_line(out)


# -- what the nodes report ------------------------------------------------------------


def recorded(name: str) -> facts.AutostopFacts | None:
    return facts.parse_autostop((RECORDED / name).read_text())


def test_parse_recorded_reports() -> None:
    assert recorded("autostop-never.txt") == facts.AutostopFacts(None, 0, False, False, False)
    assert recorded("autostop-apply.txt") == facts.AutostopFacts(1800, 0, False, True, True)
    busy = recorded("autostop-busy.txt")
    assert busy is not None and busy.busy and busy.idle_s == 0
    idle = recorded("autostop-idle.txt")
    assert idle == facts.AutostopFacts(1800, 101, False, True, True)
    assert facts.parse_autostop("bash: line 1: stat: command not found\n") is None
    assert facts.parse_autostop("autostop 1800 x 0 1 1\n") is None


def test_the_cluster_is_as_idle_as_its_least_idle_node() -> None:
    idle = recorded("autostop-idle.txt")
    busy = recorded("autostop-busy.txt")
    never = recorded("autostop-never.txt")
    assert idle is not None and busy is not None and never is not None
    assert summarize({"pc-1": never, "pc-2": never}) is None  # never used: no line
    both = summarize({"pc-1": idle, "pc-2": busy})
    assert both == ClusterIdle(after_s=1800, idle_s=0, busy=True, installed=True)
    assert "busy: a job" in both.text()
    alone = summarize({"pc-1": idle})
    assert alone is not None
    assert alone.text() == "autostop: 30m; idle 1m41s, stops in about 28m19s"
    assert ClusterIdle(None, 5, False, True).text() == "autostop: off"


# -- the watcher, run for real --------------------------------------------------------


LAYOUT = NodeLayout(
    root="tfcluster",
    code="tfcluster/code",
    python="tfcluster/venv/bin/python",
    runs="tfcluster/runs",
    logs="tfcluster/logs",
)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """A node's home under bash, with a stand-in ``sudo`` first on PATH that
    records what it was asked (never a real poweroff) and refuses
    ``sudo -n true`` (so the watcher is the setsid'd loop, as in a
    container)."""
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sudo = bin_dir / "sudo"
    sudo.write_text(
        f'#!/bin/bash\n[ "$*" = "-n true" ] && exit 1\necho "$*" >> {tmp_path}/poweroff\n'
    )
    sudo.chmod(sudo.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, HOME=str(home), PATH=f"{bin_dir}:{os.environ['PATH']}")

    def run(script: str) -> str:
        done = subprocess.run(
            ["bash", "-c", script], cwd=home, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    yield run
    for pid_file in (home / "tfcluster/autostop/watcher.pid", home / "tfcluster/logs/fake.pid"):
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text().split()[0]), 15)


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def test_watcher_keeps_a_busy_node_and_powers_an_idle_one_off(
    node: Callable[[str], str], tmp_path: Path
) -> None:
    poweroff = tmp_path / "poweroff"
    report = facts.parse_autostop(
        node(autostop_commands.autostop_apply(LAYOUT, 30, keep=False, check_every=1))
    )
    assert report == facts.AutostopFacts(30, 0, False, True, True)
    # A job task runs; its idle past (an hour) does not count while it does.
    assert "started worker-0" in node(commands.start_task(LAYOUT, "worker-0", ["sleep", "60"], {}))
    node("touch -d '-1 hour' tfcluster/autostop/active")
    time.sleep(3)
    assert not poweroff.exists()
    busy = facts.parse_autostop(node(autostop_commands.autostop_status(LAYOUT)))
    assert busy is not None and busy.busy and busy.idle_s == 0
    # A pid file naming some other process (a shell's) is no task: not busy.
    node(commands.stop_tasks(LAYOUT, ["worker-0"], grace=2))
    node(
        "sleep 100 >/dev/null 2>&1 & "
        "echo \"$! $(cut -d' ' -f22 /proc/$!/stat)\" > tfcluster/logs/fake.pid"
    )
    node("touch -d '-1 hour' tfcluster/autostop/active")
    assert wait_until(poweroff.exists, 10), "the idle node was not powered off"
    assert poweroff.read_text().split("\n")[0] in ("-n kill -TERM 1", "-n systemctl poweroff")
    assert "powering off" in (Path(tmp_path / "home/tfcluster/autostop/watch.log")).read_text()


def test_watcher_keeps_the_node_while_exec_runs_and_off_means_never(
    node: Callable[[str], str], tmp_path: Path
) -> None:
    poweroff = tmp_path / "poweroff"
    node(autostop_commands.autostop_apply(LAYOUT, 30, keep=False, check_every=1))
    proc = subprocess.Popen(
        ["bash", "-c", commands.in_workdir(LAYOUT, ".", ["sleep", "4"])],
        cwd=tmp_path / "home",
        env=dict(os.environ, HOME=str(tmp_path / "home")),
    )
    time.sleep(1)
    node("touch -d '-1 hour' tfcluster/autostop/active")
    assert proc.wait(10) == 0
    assert not poweroff.exists()  # the exec kept it busy
    # `autostop off`, kept by a later `start` (keep=True): never powered off.
    off = facts.parse_autostop(
        node(autostop_commands.autostop_apply(LAYOUT, None, keep=False, check_every=1))
    )
    assert off is not None and off.after_s is None and off.configured
    kept = facts.parse_autostop(
        node(autostop_commands.autostop_apply(LAYOUT, None, keep=True, check_every=1))
    )
    assert kept is not None and kept.after_s is None and kept.watching
    node("touch -d '-1 hour' tfcluster/autostop/active")
    time.sleep(3)
    assert not poweroff.exists()
    assert not list((tmp_path / "home/tfcluster/logs").glob("exec-*.pid"))  # swept


def report(node: Callable[[str], str]) -> facts.AutostopFacts:
    found = facts.parse_autostop(node(autostop_commands.autostop_status(LAYOUT)))
    assert found is not None
    return found


def test_busy_marks_keep_a_node_busy_until_cleared_or_stale(
    node: Callable[[str], str], tmp_path: Path
) -> None:
    """What the operator's commands do over SSH (sync, install, fetch) is
    busy while their mark is fresh; a cleared mark starts the idle clock,
    and a stale one (its command died) counts no more and is removed."""
    active = tmp_path / "home/tfcluster/autostop/active"
    marks = tmp_path / "home/tfcluster/autostop/busy"
    # Autostop never set here: a mark is nothing at all.
    node(autostop_commands.busy_mark(LAYOUT, "sync-1"))
    assert not (tmp_path / "home/tfcluster/autostop").exists()
    node(autostop_commands.autostop_apply(LAYOUT, 30, keep=False, check_every=60))
    node("touch -d '-1 hour' tfcluster/autostop/active")
    node(autostop_commands.busy_mark(LAYOUT, "sync-1"))
    assert report(node).busy and report(node).idle_s == 0
    node("touch -d '-1 hour' tfcluster/autostop/active")
    node(autostop_commands.busy_clear(LAYOUT, "sync-1"))
    after = report(node)
    assert not after.busy and after.idle_s < 30  # idle from the clear on
    assert active.stat().st_mtime > time.time() - 60
    # A mark whose command stopped renewing it long ago.
    (marks / "fetch-2").write_text(f"{int(time.time()) - BUSY_LEASE_S - 5}\n")
    assert not report(node).busy
    assert not (marks / "fetch-2").exists()


def test_tensorboard_and_a_task_ending_are_seen(node: Callable[[str], str], tmp_path: Path) -> None:
    """A running TensorBoard keeps the node busy; and the idle clock starts
    when the last task ends, not at the watcher's next look."""
    node(autostop_commands.autostop_apply(LAYOUT, 30, keep=False, check_every=60))
    board = board_layout(LAYOUT)
    node(commands.start_task(board, "tensorboard", ["sleep", "60"], {}))
    node("touch -d '-1 hour' tfcluster/autostop/active")
    assert report(node).busy
    node(commands.stop_tasks(board, ["tensorboard"], grace=2))
    assert not report(node).busy and report(node).idle_s < 30
    node("touch -d '-1 hour' tfcluster/autostop/active")
    node(commands.start_task(LAYOUT, "worker-0", ["sleep", "1"], {}))
    assert wait_until(lambda: not report(node).busy, 30)
    assert report(node).idle_s < 30


def test_a_busy_hold_renews_its_mark_and_clears_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``autostop.busy`` (what launch, exec, sweep, setup and fetch hold)
    through a real transport: busy on enter, its mark renewed while held,
    gone at the end with the idle clock started."""
    homes = tmp_path / "nodes"
    (homes / "pc-1").mkdir(parents=True)
    transport = LocalTransport(["pc-1"], homes)
    layout = transport.layout("pc-1")
    # Autostop set on the node (no watcher started: nothing may power off).
    folder = homes / "pc-1" / layout.root / "autostop"
    folder.mkdir(parents=True)
    (folder / "after").write_text("30\n")
    monkeypatch.setattr(autostop, "BUSY_RENEW_S", 0.3)

    def busy_now() -> bool:
        found = facts.parse_autostop(
            transport.run("pc-1", autostop_commands.autostop_status(layout)).stdout
        )
        assert found is not None
        return found.busy

    with autostop.busy(transport, ["pc-1"], "sync"):
        assert busy_now()
        (mark,) = list((folder / "busy").iterdir())
        assert mark.name.startswith("sync-")
        os.utime(mark, (1, 1))
        assert wait_until(lambda: mark.exists() and mark.stat().st_mtime > 1, 10)
    assert not busy_now() and not list((folder / "busy").iterdir())
    assert (folder / "active").stat().st_mtime > time.time() - 60


# -- the fake GCE's side: a guest that shuts itself down -------------------------------


def test_a_guest_shutdown_leaves_the_instance_terminated(
    fake_gce: FakeGce, gce_config: Callable[..., ClusterConfig], tmp_path: Path
) -> None:
    from infra.cluster.api import Cluster
    from infra.state.folder import ClusterState

    config = gce_config(nodes=["pc-1", "pc-2"], roles={"ps": [], "chief": "pc-1",
                        "worker": ["pc-2"]}, job={"mode": "sync"})  # fmt: skip
    cluster = Cluster(config, ClusterState(config.name, home=tmp_path))
    cluster.up(cluster.plan_up(), setup=False)
    assert fake_gce.guest_shutdown("pc-1")
    pc1 = fake_gce.instance("pc-1")
    assert pc1["status"] == "TERMINATED"
    assert "natIP" not in pc1["networkInterfaces"][0]["accessConfigs"][0]
    kinds = [op["operationType"] for op in fake_gce.operations()]
    assert kinds.count("compute.instances.guestTerminate") == 1
    # Stopped already: a second shutdown (or one after a stop of the API) is none.
    assert not fake_gce.guest_shutdown("pc-1")
    views = {v.name: v for v in cluster.status()[0]}
    assert (views["pc-1"].state, views["pc-2"].state) == ("stopped", "running")
    # `start` brings it back (no autostop was ever set: no SSH needed).
    cluster.start()
    assert fake_gce.instance("pc-1")["status"] == "RUNNING"
