"""A changed host key is exit 8 wherever it is met, never a warning or a
plain RemoteError (exit 7); what fans out to several nodes still does its
work on the others first. And a fetch that fails at the end of a job does
not hide how the chief ended.

The nodes are real SSH servers on 127.0.0.1 (``tests/hostile_node.py``):
each runs the commands it gets with ``sh`` in its own home folder, so the
tasks started, stopped and followed here are real processes. A node's key
is pinned on first contact; ``rekey()`` then makes it another machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import paramiko
import pytest
import yaml
from click.testing import CliRunner

from deploy import cli
from infra.cluster.api import Cluster
from infra.config.loader import parse_config
from infra.errors import HostKeyChanged, RemoteError, UnsafeRemoteEntry
from infra.jobs.job import Job
from infra.node import commands
from infra.providers.base import Node
from infra.providers.ssh import SshProvider
from infra.spec.job import JobSpec, Program
from infra.spec.tfconfig import TaskSpec
from infra.state.keys import ensure_key_pair
from infra.transport.base import Transport
from infra.transport.ssh import SshTarget, SshTransport
from tests.hostile_node import FILE, FakeNode, fake_node

NAME = "hk"
RUN_ID = "sleep-20260101-000000"
LAYOUT_ROOT = "tfcluster"


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "keys" / "id_ed25519"
    ensure_key_pair(path, "test")
    return path


@contextlib.contextmanager
def nodes(tmp_path: Path, key: Path, count: int, **kwargs: Any) -> Iterator[list[FakeNode]]:
    """``count`` nodes pc-1.. with a home folder each; ``kwargs`` for every one."""
    with contextlib.ExitStack() as stack:
        fakes = []
        for i in range(1, count + 1):
            if "listing" not in kwargs:
                kwargs["home"] = tmp_path / f"pc-{i}"
                kwargs["home"].mkdir(exist_ok=True)
            fakes.append(stack.enter_context(fake_node(paramiko.PKey.from_path(key), **kwargs)))
        yield fakes


def _config(key: Path, fakes: Sequence[FakeNode]) -> dict[str, Any]:
    names = [f"pc-{i}" for i in range(1, len(fakes) + 1)]
    return {
        "name": NAME,
        "provider": "ssh",
        "nodes": names,
        "roles": {"ps": [], "chief": names[0], "worker": names[1:]},
        "hosts": {n: f"127.0.0.1:{f.port}" for n, f in zip(names, fakes, strict=True)},
        "ssh": {"key_file": str(key), "boot_timeout": 5},
        "job": {"mode": "sync" if len(fakes) > 1 else "single"},
    }


def _cluster(key: Path, fakes: Sequence[FakeNode]) -> Cluster:
    return Cluster(parse_config(_config(key, fakes), source="test"))


def _pin(cluster: Cluster) -> SshTransport:
    """First contact with every node (their keys are pinned); the transport."""
    transport = cluster.provider.transport(cluster.nodes())
    assert isinstance(transport, SshTransport)
    transport.wait_ready()
    return transport


def _tasks(count: int) -> list[TaskSpec]:
    chief = TaskSpec(type="chief", index=0, node="pc-1", host="127.0.0.1", port=2222)
    workers = [
        TaskSpec(type="worker", index=i, node=f"pc-{i + 2}", host="127.0.0.1", port=2223 + i)
        for i in range(count - 1)
    ]
    return [chief, *workers]


def _job(transport: Transport, tasks: list[TaskSpec], argv: tuple[str, ...] = ("true",)) -> Job:
    program = Program(argv=argv, task_types=("chief", "worker"), in_workdir=False)
    return Job(transport, tasks, JobSpec(run_id=RUN_ID, program=program))


def _start(transport: Transport, job: Job, task: TaskSpec, argv: tuple[str, ...]) -> int:
    """Start ``argv`` as ``task`` on its node, as a job does; its pid."""
    layout = transport.layout(task.node)
    script = commands.start_task(layout, task.name, argv, {}, run_dir=job.run_dir(task.node))
    result = transport.run(task.node, script, timeout=30)
    assert result.ok, result.stderr
    return int(result.stdout.split()[-1])


def _alive(pid: int) -> bool:
    """The task's process runs (a zombie, killed and not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait_dead(pid: int, within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


@contextlib.contextmanager
def killed_at_end(pids: list[int]) -> Iterator[None]:
    """The tasks a test started (a refused node keeps its own): ended after it."""
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # setsid: the task leads its group


# -- cancel: the other nodes are stopped, then exit 8 ------------------------------------


def test_deploy_cancel_with_a_changed_host_key_stops_the_rest_and_exits_8(
    tmp_path: Path, key: Path
) -> None:
    """It was a warning ('could not reach pc-2 to stop worker-0') and exit 0."""
    with nodes(tmp_path, key, 3) as fakes:
        cluster = _cluster(key, fakes)
        tasks = _tasks(3)
        with _pin(cluster) as transport:
            job = _job(transport, tasks)
            pids = [_start(transport, job, t, ("sleep", "60")) for t in tasks]
            cluster.remember(job)
        with killed_at_end(pids):
            fakes[1].rekey()  # pc-2 is another machine now
            config = tmp_path / "cluster.yaml"
            config.write_text(yaml.safe_dump(_config(key, fakes)))
            asked = len(fakes[1].commands)
            result = CliRunner().invoke(cli, ["-c", str(config), "cancel"])
            assert result.exit_code == 8, result.output
            where = f"[127.0.0.1]:{fakes[1].port}"
            assert result.output.startswith(f"error: pc-2: the host key of {where} "), result.output
            assert "Traceback" not in result.output
            # pc-1 and pc-3 were stopped all the same; pc-2 was never talked to.
            assert _wait_dead(pids[0]) and _wait_dead(pids[2])
            assert _alive(pids[1])
            assert len(fakes[1].commands) == asked


# -- status and the failure details ----------------------------------------------------


def test_status_and_failure_details_raise_a_changed_host_key(tmp_path: Path, key: Path) -> None:
    """They skipped the node (as one that is gone): a job there looked
    finished, so `train` could start over it."""
    with nodes(tmp_path, key, 2) as fakes:
        cluster = _cluster(key, fakes)
        transport = _pin(cluster)
        transport.close()
        fakes[1].rekey()
        with transport:
            job = _job(transport, _tasks(2))
            for call in (job.status, job.running, job.failed_tasks):
                with pytest.raises(HostKeyChanged) as caught:
                    call()
                assert caught.value.exit_code == 8
            with pytest.raises(HostKeyChanged):
                job.failure_details(job.tasks)


def test_watch_with_a_changed_host_key_stops_the_rest_and_records_the_chiefs_code(
    tmp_path: Path, key: Path
) -> None:
    """The chief fails (exit 3); asking the others how they ended meets
    pc-2's new key: exit 8, pc-3's task is stopped all the same, and the
    chief's own code is what the state file records."""
    with nodes(tmp_path, key, 3) as fakes:
        cluster = _cluster(key, fakes)
        tasks = _tasks(3)
        transport = _pin(cluster)
        job = _job(transport, tasks)
        pids = [_start(transport, job, t, ("sleep", "60")) for t in tasks[1:]]
        with killed_at_end(pids):
            pids.append(_start(transport, job, tasks[0], ("sh", "-c", "sleep 1; exit 3")))
            cluster.remember(job)
            transport._drop("pc-2")  # the next contact meets the new machine
            fakes[1].rekey()
            with transport, pytest.raises(HostKeyChanged):
                cluster.watch(job, tmp_path / "dest")
            assert _wait_dead(pids[1])  # pc-3's worker
            assert _alive(pids[0])  # pc-2's: not ours to reach any more
    last = cluster.last_job()
    assert last is not None and last.exit_code == 3


def test_a_start_that_fails_stops_what_it_started_despite_a_changed_key(
    tmp_path: Path, key: Path
) -> None:
    """A worker dies before it listens; asking every node how its tasks
    ended meets pc-2's new key: exit 8, and what the job started on the
    nodes that answer is stopped all the same (not left running)."""
    with nodes(tmp_path, key, 3) as fakes:
        cluster = _cluster(key, fakes)
        chief, *workers = tasks = _tasks(3)
        with _pin(cluster) as transport:
            job = _job(transport, tasks)
            pids = [_start(transport, job, t, ("sleep", "60")) for t in (chief, workers[0])]
            with killed_at_end(pids):
                _start(transport, job, workers[1], ("sh", "-c", "exit 5"))
                job.started = list(tasks)
                transport._drop("pc-2")
                fakes[1].rekey()
                with pytest.raises(HostKeyChanged):
                    job._wait_ready([workers[1]])
                assert _wait_dead(pids[0])  # the chief on pc-1
                assert _alive(pids[1])  # pc-2's: not ours to reach any more


# -- the fetch at the end: the chief's code is recorded ---------------------------------


@pytest.mark.parametrize("failure", ["changed key", "unsafe entry"])
def test_a_failed_fetch_after_the_job_records_the_chiefs_exit_code(
    tmp_path: Path, key: Path, failure: str
) -> None:
    """The chief exited 0; the fetch then meets a re-created node or a
    file that climbs out. The error is raised, and the state file says 0
    (it said -1, as for a chief that never reported)."""
    remote = f"{LAYOUT_ROOT}/runs/{RUN_ID}"
    entries = [("../escape", FILE)] if failure == "unsafe entry" else []
    with nodes(
        tmp_path,
        key,
        1,
        listing=lambda path: list(entries) if path == remote else None,
        follow_output="@tfcluster-exit 0\n",
    ) as fakes:
        cluster = _cluster(key, fakes)
        fake = fakes[0]

        class Reboots(SshTransport):
            # The node restarts as another machine once the chief's log ended.
            def stream(self, node: str, *args: Any, **kwargs: Any) -> int:
                code = super().stream(node, *args, **kwargs)
                if failure == "changed key":
                    self._drop(node)
                    fake.rekey()
                return code

        transport = Reboots(
            [SshTarget("pc-1", "127.0.0.1", fake.port)],
            config=cluster.config,
            state=cluster.state,
            key_file=key,
        )
        job = _job(transport, _tasks(1))
        cluster.remember(job)
        expected = HostKeyChanged if failure == "changed key" else UnsafeRemoteEntry
        with transport, pytest.raises(expected):
            cluster.watch(job, tmp_path / "dest")
    last = cluster.last_job()
    assert last is not None and last.run_id == RUN_ID and last.exit_code == 0
    assert job.exit_code == 0


# -- exec: every node runs it, then exit 8 --------------------------------------------


def test_exec_meeting_a_changed_host_key_runs_elsewhere_then_raises_it(
    tmp_path: Path, key: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pc-2 is re-created between the sync and the command. The error was
    one line of a plain RemoteError (exit 7)."""
    workdir = tmp_path / "project"
    workdir.mkdir()
    with nodes(tmp_path, key, 3) as fakes:
        cluster = _cluster(key, fakes)
        _pin(cluster).close()
        make: Callable[[SshProvider, list[Node]], Transport] = SshProvider.transport

        class Recreated(SshTransport):
            def stream(self, node: str, *args: Any, **kwargs: Any) -> int:
                if node == "pc-2":
                    self._drop(node)
                    fakes[1].rekey()
                return super().stream(node, *args, **kwargs)

        def transport(provider: SshProvider, chosen: list[Node]) -> Transport:
            plain = make(provider, chosen)
            assert isinstance(plain, SshTransport)
            return Recreated(
                list(plain.targets.values()),
                config=plain.config,
                state=plain.state,
                key_file=plain.key_file,
            )

        monkeypatch.setattr(SshProvider, "transport", transport)
        lines: list[tuple[str, str]] = []
        with pytest.raises(HostKeyChanged) as caught:
            cluster.exec(
                ["sh", "-c", "echo ran; touch ran-here"],
                None,
                workdir=workdir,
                on_line=lambda node, line: lines.append((node, line)),
            )
    assert caught.value.exit_code == 8
    assert str(caught.value).startswith("pc-2: the host key of ")
    assert sorted(lines) == [("pc-1", "ran"), ("pc-3", "ran")]
    for node in ("pc-1", "pc-3"):
        assert (tmp_path / node / LAYOUT_ROOT / "work" / "ran-here").is_file()
    assert not (tmp_path / "pc-2" / LAYOUT_ROOT / "work" / "ran-here").exists()


# -- logs --follow: a thread's error is not lost -----------------------------------------


class _Following(FakeNode):
    """A node whose log follow prints a line and then goes on until the
    client hangs up (as `tail -F`, without a process to clean up)."""

    def execute(self, channel: paramiko.Channel, command: str) -> None:
        time.sleep(0.05)
        try:
            channel.sendall(b"==> tfcluster/logs/chief-0.log <==\nstep 1\n")
            while not channel.closed and not self._stop.is_set():
                time.sleep(0.05)
        finally:
            channel.close()


def test_logs_follow_raises_a_changed_host_key_at_once(tmp_path: Path, key: Path) -> None:
    """It was lost in pc-2's thread (a traceback on stderr) while pc-1 went
    on being followed: no error, and exit 0 at Ctrl-C."""
    with contextlib.ExitStack() as stack:
        fakes = [
            stack.enter_context(contextlib.closing(_Following(paramiko.PKey.from_path(key))))
            for _ in range(2)
        ]
        cluster = _cluster(key, fakes)
        _pin(cluster).close()
        fakes[1].rekey()
        shown: list[tuple[str, str, str]] = []
        outcome: list[BaseException | None] = []

        def follow() -> None:
            try:
                cluster.logs(None, lines=10, follow=True, on_line=lambda *a: shown.append(a))
                outcome.append(None)
            except BaseException as exc:  # the finding, checked below
                outcome.append(exc)

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        thread.join(20)
        assert not thread.is_alive(), "still following: the changed key was lost"
    assert len(outcome) == 1 and isinstance(outcome[0], HostKeyChanged), outcome
    assert str(outcome[0]).startswith("pc-2: ")
    assert ("pc-1", "chief-0", "step 1") in shown


def test_logs_follow_raises_when_every_node_is_lost(tmp_path: Path, key: Path) -> None:
    """A node that goes away ends its follow with a RemoteError: once none
    is left it is raised (it was a thread's traceback and exit 0)."""
    with contextlib.ExitStack() as stack:
        fakes = [
            stack.enter_context(contextlib.closing(_Following(paramiko.PKey.from_path(key))))
            for _ in range(2)
        ]
        cluster = _cluster(key, fakes)
        _pin(cluster).close()
        outcome: list[BaseException | None] = []

        def follow() -> None:
            try:
                cluster.logs(None, lines=10, follow=True, on_line=lambda *a: None)
                outcome.append(None)
            except BaseException as exc:  # the finding, checked below
                outcome.append(exc)

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        time.sleep(1.0)
        for fake in fakes:  # both machines go away
            for server in fake._transports:
                server.close()
        thread.join(20)
        assert not thread.is_alive()
    assert len(outcome) == 1 and type(outcome[0]) is RemoteError, outcome
    assert "pc-1: " in str(outcome[0]) and "pc-2: " in str(outcome[0])
