"""Two commands at once: the cluster lock, and keys made by racing processes.

Real processes throughout (a lock is between processes; flock is per open
file, so threads of one process are tested too)."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from deploy import cli
from infra.cluster.api import Cluster
from infra.config.loader import ClusterConfig, default_config
from infra.errors import StateError
from infra.state.folder import ClusterState
from infra.state.keys import ensure_key_pair
from infra.state.lock import LOCK_WAIT_ENV, ClusterLock
from tests.fake_gce import FakeGce

pytest_plugins = ["tests.fake_gce.fixtures"]

REPO = Path(__file__).resolve().parents[1]
# A line of one of these means the command was refused for the lock.
BUSY = "local is busy: held by `deploy.py train`"


def run(*args: str, input: str | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)
    return result.exit_code, result.output


@contextmanager
def held_elsewhere(command: str = "train") -> Iterator[subprocess.Popen[str]]:
    """The local cluster's lock, held by another process until the block ends."""
    code = (
        "import sys\n"
        "from infra.state.lock import ClusterLock\n"
        "from infra.state.folder import ClusterState\n"
        "lock = ClusterLock(ClusterState('local').lock_file, 'local')\n"
        "with lock.hold(sys.argv[1], wait=0):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, command],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        if proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- keys --------------------------------------------------------------------------


def _make_key(barrier: object, key: str, results: object) -> None:
    barrier.wait()  # type: ignore[attr-defined]
    try:
        line = ensure_key_pair(Path(key), "tfcluster-test")
        results.put(("ok", line, Path(key).read_bytes()))  # type: ignore[attr-defined]
    except BaseException as exc:  # every failure is the finding
        results.put(("error", repr(exc), b""))  # type: ignore[attr-defined]


@pytest.mark.parametrize("round_", range(3))  # a race: several rounds to meet it
def test_concurrent_first_key_creation_ends_with_one_complete_key(
    tmp_path: Path, round_: int
) -> None:
    """Two first `up`s used to race: O_EXCL made the losers crash with
    FileExistsError, and a loser could read a half-written key."""
    ctx = multiprocessing.get_context("fork")
    n = 20
    barrier, results = ctx.Barrier(n), ctx.Queue()
    key = tmp_path / "clusters" / "c" / "id_ed25519"
    procs = [ctx.Process(target=_make_key, args=(barrier, str(key), results)) for _ in range(n)]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=60) for _ in range(n)]
    for proc in procs:
        proc.join(30)
    errors = [why for kind, why, _ in outcomes if kind == "error"]
    assert errors == []
    assert len({line for _, line, _ in outcomes}) == 1
    assert len({pem for _, _, pem in outcomes}) == 1
    (line,) = {line for _, line, _ in outcomes}
    assert line.startswith("ssh-ed25519 ") and line.endswith(" tfcluster-test")
    assert key.with_name("id_ed25519.pub").read_text() == line + "\n"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.with_name("id_ed25519.pub").stat().st_mode) == 0o644
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    # No temp file left behind by the losers.
    assert sorted(p.name for p in key.parent.iterdir()) == ["id_ed25519", "id_ed25519.pub"]


def test_a_public_key_left_from_a_deleted_key_is_rewritten(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    first = ensure_key_pair(key, "c")
    key.unlink()  # the .pub of the old key stays
    second = ensure_key_pair(key, "c")
    assert second != first
    assert key.with_name("id_ed25519.pub").read_text() == second + "\n"


# -- the lock ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["up"],
        ["up", "--skip-setup"],
        ["start"],
        ["stop"],
        ["down", "--yes"],
        ["train", "--steps", "1"],
        ["run", "--", "true"],
        ["cancel"],
    ],
)
def test_a_changing_command_waits_then_names_the_holder(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run("up")[0] == 0
    monkeypatch.setenv(LOCK_WAIT_ENV, "0.5")
    with held_elsewhere("train") as holder:
        began = time.monotonic()
        code, out = run(*args)
        waited = time.monotonic() - began
    assert code == 3, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {BUSY} (pid {holder.pid}, since ")
    assert "gave up after 0.5 s" in errors[0]
    assert f"kill {holder.pid}" in out and "Traceback" not in out
    assert waited >= 0.5


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["logs"], ["fetch"]])
def test_reading_commands_never_wait_for_the_lock(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run("up")[0] == 0
    monkeypatch.setenv(LOCK_WAIT_ENV, "300")
    with held_elsewhere("up"):
        began = time.monotonic()
        code, out = run(*args)
        # Waiting would take 300 s; the margin is for a busy machine.
        assert time.monotonic() - began < 100
    assert "busy" not in out and "Traceback" not in out
    assert code in (0, 3), out  # logs, fetch: no job yet (3)


def test_a_waiting_command_goes_on_when_the_holder_is_done(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(LOCK_WAIT_ENV, "20")
    with held_elsewhere("up") as holder:
        assert holder.stdin is not None
        release = threading.Timer(1.0, holder.stdin.close)
        release.start()
        began = time.monotonic()
        code, out = run("up")
        release.join()
    assert code == 0, out
    assert time.monotonic() - began >= 1.0
    words = " ".join(out.split())  # a warning may be wrapped at the terminal's width
    assert f"local is busy: `deploy.py up` (pid {holder.pid}, since " in words
    assert "holds it; waiting up to 20 s" in words
    assert "local is up" in out


def test_a_killed_holder_leaves_no_stale_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """flock dies with its process: nothing to clean up by hand."""
    monkeypatch.setenv(LOCK_WAIT_ENV, "300")
    with held_elsewhere("up") as holder:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        began = time.monotonic()
        code, out = run("up")
    assert code == 0, out
    assert "busy" not in out  # never waited on a lock that died with its holder
    assert time.monotonic() - began < 100


def test_the_busy_message_says_how_long_it_waited_and_who(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lock = ClusterLock(ClusterState("local").lock_file, "local")
    with held_elsewhere("down") as holder:
        assert lock.holder() is not None and lock.holder().pid == holder.pid  # type: ignore[union-attr]
        with pytest.raises(StateError) as caught, lock.hold("up", wait=0.2):
            pass
    message = str(caught.value)
    assert message.startswith("local is busy: held by `deploy.py down` (pid ")
    assert "\n" not in message
    assert lock.holder() is None  # released: the file no longer names anyone


def test_the_lock_excludes_threads_of_one_process_and_is_reentrant() -> None:
    state = ClusterState("local")
    first = ClusterLock(state.lock_file, "local")
    second = ClusterLock(state.lock_file, "local")
    with first.hold("up"):
        with first.hold("up"):  # a locked method calling another
            pass
        with (
            pytest.raises(StateError, match=re.escape("held by `deploy.py up`")),
            second.hold("down", wait=0.2),
        ):
            pass
    with second.hold("down", wait=0):
        pass


def test_a_bad_lock_wait_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOCK_WAIT_ENV, "soon")
    code, out = run("up")
    assert code == 2
    assert out.splitlines()[-1] == (
        f"error: {LOCK_WAIT_ENV}='soon': not a number of seconds; set e.g. {LOCK_WAIT_ENV}=60"
    )


def test_two_concurrent_ups_both_succeed(tfcluster_home: Path) -> None:
    """Two `deploy.py up` processes at once: the second waits for the
    first and then finds the cluster up; neither crashes."""
    env = {**os.environ, "TFCLUSTER_HOME": str(tfcluster_home)}
    procs = [
        subprocess.Popen(
            [sys.executable, "deploy.py", "up"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [proc.communicate(timeout=120)[0] for proc in procs]
    for proc, out in zip(procs, outs, strict=True):
        assert proc.returncode == 0, out
        assert "Traceback" not in out and "unexpected" not in out
    state = ClusterState("local")
    assert sorted(state.get("nodes")) == ["pc-1", "pc-2", "pc-3"]
    assert not list(state.dir.glob("state.json.corrupt-*"))


# -- jobs: the lock while launching, not while following -----------------------------

SERVE = """\
import json, os, socket, time
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
host, port = config["cluster"][task["type"]][task["index"]].rsplit(":", 1)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((host, int(port)))
server.listen()
time.sleep(120)
"""


def test_a_launched_job_releases_the_lock_so_cancel_gets_through(tmp_path: Path) -> None:
    (tmp_path / "serve.py").write_text(SERVE)
    cluster = Cluster(default_config())
    spec = cluster.run_spec(["python", "serve.py"])
    job = cluster.launch(spec, workdir=tmp_path)
    try:
        assert job.running()
        # Another command (another Cluster: its own open file) gets the
        # lock at once while the job runs: `train` follows without it.
        other = Cluster(default_config())
        with other.lock("cancel"):
            pass
        record, stopped = other.cancel()
        assert record.run_id == spec.run_id and stopped
    finally:
        job.stop()
    assert cluster.last_job() is not None and cluster.last_job().exit_code == 130  # type: ignore[union-attr]


def test_launch_holds_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "serve.py").write_text(SERVE)
    cluster = Cluster(default_config())
    spec = cluster.run_spec(["python", "serve.py"])
    monkeypatch.setenv(LOCK_WAIT_ENV, "0.2")
    with (
        held_elsewhere("cancel"),
        pytest.raises(StateError, match=re.escape("held by `deploy.py cancel`")),
    ):
        cluster.launch(spec, workdir=tmp_path)
    assert cluster.last_job() is None


# -- GCE: two ups with the same (stale) plan ----------------------------------------


def test_two_concurrent_gce_ups_create_each_node_once(
    gce_config: Callable[..., ClusterConfig], fake_gce: FakeGce
) -> None:
    """Both plan "create every node" before either acts (two terminals):
    the second must wait, see the first's nodes and adopt them, not insert
    them again (on GCE a failed create starts the zone failover, whose
    cleanup deletes what it believes it made)."""
    clusters = [Cluster(gce_config()), Cluster(gce_config())]
    plans = [c.plan_up() for c in clusters]
    assert all(p.create == ["pc-1", "pc-2", "pc-3", "pc-4"] for p in plans)
    results: list[object] = [None, None]

    def up(i: int) -> None:
        try:
            results[i] = clusters[i].up(plans[i], setup=False)[0]
        except BaseException as exc:  # the finding, reported below
            results[i] = exc

    threads = [threading.Thread(target=up, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(isinstance(r, list) and len(r) == 4 for r in results), results
    # str(): a call that named no instance would show as "None" in the diff.
    inserts = [str(c.name) for c in fake_gce.mutating_calls() if c.op == "instances.insert"]
    assert sorted(inserts) == ["pc-1", "pc-2", "pc-3", "pc-4"]
    assert not [c for c in fake_gce.mutating_calls() if c.op == "instances.delete"]
    assert [i["status"] for i in fake_gce.instances()] == ["RUNNING"] * 4


# -- exec: the lock while syncing, not while the command runs ------------------------


def test_exec_holds_the_lock_while_it_readies_the_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """exec syncs the working folder (and brings a local cluster up): a
    change, under the lock as a launch is. It took none."""
    assert run("up")[0] == 0
    cluster = Cluster(default_config())
    monkeypatch.setenv(LOCK_WAIT_ENV, "0.2")
    with (
        held_elsewhere("cancel"),
        pytest.raises(StateError, match=re.escape("held by `deploy.py cancel`")),
    ):
        cluster.exec(["touch", "ran"], None, workdir=tmp_path, on_line=lambda n, line: None)
    assert not (tmp_path / "ran").exists()


def test_a_running_exec_does_not_keep_cancel_out(tmp_path: Path) -> None:
    """`exec -- nvidia-smi -l` runs until Ctrl-C: another command gets the
    lock meanwhile."""
    assert run("up")[0] == 0
    cluster = Cluster(default_config())
    script = "touch started; while [ ! -e go ]; do sleep 0.1; done; echo done"
    codes: list[dict[str, int]] = []
    runner = threading.Thread(
        target=lambda: codes.append(
            cluster.exec(
                ["sh", "-c", script], ["pc-1"], workdir=tmp_path, on_line=lambda n, line: None
            )
        ),
        daemon=True,
    )
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "started").exists()
        # Another command (its own open file) gets the lock at once.
        with ClusterLock(ClusterState("local").lock_file, "local").hold("cancel", wait=0):
            pass
    finally:
        (tmp_path / "go").touch()
        runner.join(30)
    assert codes == [{"pc-1": 0}]
