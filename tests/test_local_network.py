"""The local cluster's tasks in a network namespace of their own
(infra/providers/local_network.py): a real job whose task ports no other
address of this machine reaches while it trains to its end; the namespace
made once for two commands at once, remade after a reboot, ended by `down`;
and where the tasks cannot be confined (cluster.yaml's `local.network:
host`, a system that refuses user namespaces), one warning naming the
job's ports."""

from __future__ import annotations

import contextlib
import http.server
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from deploy import cli
from infra.cluster.api import Cluster
from infra.config.loader import load_config
from infra.errors import JobFailed
from infra.jobs.job import Job
from infra.jobs.progress import ProgressEvent
from infra.jobs.run import JobReporter
from infra.providers.local import LocalProvider
from infra.providers.local_network import NOT_CONFINED_EXIT, Holder, TaskNetwork
from tests.procs import none_left_in

REPO = Path(__file__).resolve().parents[1]
STAND_IN = REPO / "tests" / "programs" / "stand_in.py"
STEPS = 40


def _namespaces_work() -> bool:
    return shutil.which("nsenter") is not None and (
        subprocess.run(["unshare", "--user", "--net", "true"], capture_output=True).returncode == 0
    )


needs_namespaces = pytest.mark.skipif(
    not _namespaces_work(), reason="this system refuses user and network namespaces"
)


def write_config(folder: Path, **extra: object) -> Path:
    config = {
        "name": "netns",
        "provider": "local",
        "nodes": ["pc-1", "pc-2"],
        "roles": {"ps": "pc-1", "chief": "pc-1", "worker": "pc-2"},
        "job": {"mode": "async", "steps": STEPS, "checkpoint_every": STEPS, "batch_size": 32},
        **extra,
    }
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def this_machines_address() -> str | None:
    """An address of this machine other than loopback: the one it would
    send from (a UDP "connect" sends nothing); None where it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routed, never answered
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") else address


def connects(source: str, port: int) -> bool:
    """Whether a TCP connection from ``source`` to ``source:port`` opens."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.bind((source, 0))
        try:
            s.connect((source, port))
        except OSError:
            return False
        return True


def listens(pid: int, port: int) -> bool:
    """Whether ``port`` is listened on in the network namespace of process
    ``pid`` (its /proc/PID/net/tcp*: the sockets of its namespace)."""
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    return True
    return False


def task_pid(cluster: Cluster, node: str, task: str) -> int:
    pid_file = cluster.state.dir / "nodes" / node / "tfcluster" / "logs" / f"{task}.pid"
    return int(pid_file.read_text().split()[0])


class Prober(JobReporter):
    """At the job's first progress line (it trains: its tasks talk to each
    other), tries every task's port from outside the namespace."""

    def __init__(self, cluster: Cluster, address: str | None) -> None:
        self.cluster = cluster
        self.sources = ["127.0.0.1", *([address] if address else [])]
        self.job: Job | None = None
        self.seen: dict[str, dict[str, bool]] = {}

    def launched(self, job: Job) -> None:
        self.job = job

    def event(self, event: ProgressEvent) -> None:
        if event.kind != "progress" or self.seen or self.job is None:
            return
        for task in self.job.tasks:
            pid = task_pid(self.cluster, task.node, task.name)
            self.seen[task.name] = {
                "listens inside": listens(pid, task.port),
                "listens here": listens(os.getpid(), task.port),
                "other namespace": os.readlink(f"/proc/{pid}/ns/net")
                != os.readlink("/proc/self/ns/net"),
                **{f"from {s}": connects(s, task.port) for s in self.sources},
            }


@needs_namespaces
def test_no_other_address_reaches_a_training_jobs_ports(tmp_path: Path, mnist_dir: Path) -> None:
    """A real async job (ps, worker, chief): while it trains, its ps and
    worker listen in their namespace and nowhere here, a connection from
    this machine's own address (and from its 127.0.0.1) to any task's port
    is refused; and the job trains to its end."""
    cluster = Cluster(load_config(write_config(tmp_path)))
    prober = Prober(cluster, this_machines_address())
    result = cluster.train(reporter=prober, dest=tmp_path / "results")
    result.check()
    assert result.summary is not None and result.summary["steps"] == STEPS
    assert set(prober.seen) == {"ps-0", "worker-0", "chief-0"}, prober.seen
    for name, seen in prober.seen.items():
        assert seen["other namespace"], f"{name}: {seen}"
        assert not seen["listens here"], f"{name}: {seen}"
        assert not any(v for k, v in seen.items() if k.startswith("from ")), f"{name}: {seen}"
    # The servers did listen, where the job's own tasks reach them.
    assert prober.seen["ps-0"]["listens inside"] and prober.seen["worker-0"]["listens inside"]


@needs_namespaces
def test_the_trainers_data_is_fetched_here_before_its_tasks_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without MNIST_DIR the trainer downloads MNIST, which its namespace
    cannot: `train` fetches it on this machine's network first. Here from
    a mirror on this machine's 127.0.0.1 (which the tasks could not reach)
    serving bad files: the launcher's own fetch refuses them (the trainer's
    exit code 4 and its line), and no task was started."""
    requests: list[str] = []

    class Mirror(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"junk")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Mirror)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.delenv("MNIST_DIR", raising=False)
    monkeypatch.setenv("TFCLUSTER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TFCLUSTER_MNIST_MIRROR", f"http://127.0.0.1:{server.server_port}/")
    cluster = Cluster(load_config(write_config(tmp_path)))
    try:
        with pytest.raises(JobFailed) as failed:
            cluster.train(dest=tmp_path / "results")
    finally:
        server.shutdown()
    assert failed.value.exit_code == 4
    assert "train-images-idx3-ubyte.gz is corrupted" in str(failed.value), failed.value
    assert requests == ["/train-images-idx3-ubyte.gz"]
    assert not list((cluster.state.dir / "nodes").glob("*/tfcluster/logs/*.pid"))


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "project"
    folder.mkdir()
    shutil.copy(STAND_IN, folder / "stand_in.py")
    yield folder
    none_left_in(folder)


def test_unconfined_tasks_are_warned_about_once_naming_their_ports(
    tmp_path: Path, workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`local.network: host`: `up` says the servers will be open, and a job
    says once which of its ports are open, and what to do."""
    cluster = Cluster(load_config(write_config(tmp_path, local={"network": "host"})))
    with caplog.at_level(logging.WARNING, logger="tfcluster"):
        cluster.up(cluster.plan_up())
    (at_up,) = [r.getMessage() for r in caplog.records]
    assert "will listen on every address of this machine" in at_up
    assert "local.network is host" in at_up and "host firewall" in at_up
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tfcluster"):
        result = cluster.run_program(
            ["python", "stand_in.py"], workdir=workdir, env={"CHIEF_SLEEP": "0"}
        )
    result.check()
    (warning,) = [r.getMessage() for r in caplog.records]
    ports = sorted(t.port for t in result.job.tasks)
    assert f"ports {', '.join(map(str, ports))} (local.network is host in cluster.yaml)" in warning
    assert "host firewall" in warning
    assert not (cluster.state.dir / "netns").exists()  # no namespace was made


@needs_namespaces
def test_a_system_that_refuses_namespaces_runs_the_job_and_says_so(
    tmp_path: Path, workdir: Path
) -> None:
    """Where user namespaces are refused (here: their limit set to 0 in a
    user namespace of the test's), `run` still runs, on this machine's
    network, and its one warning names the ports and why."""
    config = write_config(tmp_path)
    limit = "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$@\""
    done = subprocess.run(
        ["unshare", "--map-root-user", "sh", "-c", limit, "sh",
         sys.executable, str(REPO / "deploy.py"), "--config", str(config),
         "run", "--env", "CHIEF_SLEEP=0", "--workdir", str(workdir),
         "--", "python", "stand_in.py"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "1000", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    warnings = [line for line in out.splitlines() if "TensorFlow servers listen" in line]
    assert len(warnings) == 1, out
    assert "(this system refuses user namespaces (unshare: No space left on device" in warnings[0]
    assert "ports " in warnings[0] and "host firewall" in warnings[0]


@needs_namespaces
def test_up_makes_one_namespace_and_down_ends_it(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    result = CliRunner().invoke(cli, ["--config", str(config), "up"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "network namespace of their own" in " ".join(result.output.split())
    network = TaskNetwork(Cluster(load_config(config)).state.dir, sys.executable)
    holder = network.current()
    assert holder is not None and holder.alive()
    # A second `up` finds it.
    CliRunner().invoke(cli, ["--config", str(config), "up"], catch_exceptions=False)
    assert network.current() == holder
    result = CliRunner().invoke(cli, ["--config", str(config), "down", "--yes"])
    assert result.exit_code == 0, result.output
    deadline = time.monotonic() + 10
    while holder.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not holder.alive() and network.current() is None


_ENSURE = """
import sys, time
from pathlib import Path
from infra.providers.local_network import TaskNetwork
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.005)
print(TaskNetwork(Path(sys.argv[1]), sys.executable).ensure())
"""


@needs_namespaces
def test_two_commands_at_once_make_one_namespace(tmp_path: Path) -> None:
    folder, go = tmp_path / "state", tmp_path / "go"
    argv = [sys.executable, "-c", _ENSURE, str(folder), str(go)]
    procs = [
        subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    time.sleep(1.0)  # both have imported and wait for the word
    go.touch()
    said = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert said[0] == said[1] and said[0].startswith("Holder(pid="), said
    assert TaskNetwork(folder, sys.executable).end()


@needs_namespaces
def test_a_stale_record_is_replaced_and_never_harms_its_pid(tmp_path: Path) -> None:
    """After a reboot the record names a pid that may be anyone's: a live
    process of ours that is not the holder (another start tick, another
    namespace) is neither used nor ended; a new namespace is made."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        network = TaskNetwork(tmp_path, sys.executable)
        tick = Path(f"/proc/{other.pid}/stat").read_text().rpartition(")")[2].split()[19]
        for record in (
            f"{other.pid} {int(tick) + 1} {os.readlink(f'/proc/{other.pid}/ns/net')}",
            f"{other.pid} {tick} net:[1]",
            f"{other.pid} {tick} net:[$(touch {tmp_path}/pwned)]",
            "not a record",
        ):
            (tmp_path / "netns").write_text(record)
            assert network.current() is None
            assert not network.end()
            assert other.poll() is None
        holder = TaskNetwork(tmp_path, sys.executable).ensure()
        assert isinstance(holder, Holder) and holder.pid != other.pid
        assert not (tmp_path / "pwned").exists()
        assert os.readlink(f"/proc/{holder.pid}/ns/net") == holder.netns
        assert network.end() and other.poll() is None
    finally:
        other.kill()
        other.wait()


@needs_namespaces
def test_a_command_outside_the_recorded_namespace_fails_closed(tmp_path: Path) -> None:
    """The check a confined command starts with: run where the recorded
    namespace is not (here: plain bash on this machine), it refuses."""
    network = TaskNetwork(tmp_path, sys.executable)
    try:
        argv = network.argv("echo ran")
        assert argv is not None
        inside = subprocess.run(argv, capture_output=True, text=True)
        assert inside.returncode == 0 and inside.stdout == "ran\n", inside
        outside = subprocess.run(["bash", "-c", argv[-1]], capture_output=True, text=True)
        assert outside.returncode == NOT_CONFINED_EXIT and outside.stdout == ""
        assert "not in the local cluster's network namespace" in outside.stderr
    finally:
        network.end()


def test_without_nsenter_the_reason_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = Cluster(load_config(write_config(tmp_path))).provider
    assert isinstance(provider, LocalProvider)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert provider.exposure() == "nsenter (util-linux) is not installed"


def test_every_task_port_the_provider_gives_is_its_own(tmp_path: Path) -> None:
    """The kernel hands a just-released port out again readily (about 3 in
    100 draws here; CI once gave worker-1 and ps-0 one port): the provider
    never gives one port twice."""
    provider = Cluster(load_config(write_config(tmp_path))).provider
    ports = [provider.task_port("pc-1", "worker", i) for i in range(1000)]
    assert len(set(ports)) == len(ports)
