"""Issue 26: `deploy.py up` waits only where it must, and stops waiting
when told. `up --skip-setup` asks no node anything (nothing is installed
to answer, and asking waits for each node's host keys and SSH). A SIGTERM
(what `timeout`, systemd and CI runners send) ends `up` within seconds, as
Ctrl-C does, whatever it waits for: a real deploy.py process against the
fake Compute API on loopback, signalled while it waits for the create
operations and while it waits for the nodes' host keys in their guest
attributes (before the first SSH connection), each of which would
otherwise last minutes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from deploy import cli
from tests.fake_gce import FakeGce

pytest_plugins = ["tests.fake_gce.fixtures"]

DLVM = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11"

REPO = Path(__file__).resolve().parents[1]
# The README's exit code for Ctrl-C, `kill` and SIGTERM.
EXIT_INTERRUPTED = 130
# The bound, from the signal to the process gone.
WITHIN_S = 10.0


def start_up(config: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(REPO / "deploy.py"), "--config", str(config), "up", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "300"},  # TFCLUSTER_HOME: this test's (conftest)
        start_new_session=True,  # a test runner's Ctrl-C is not for it
    )


def wait_until(proc: subprocess.Popen[str], ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 120  # imports and the first calls, on a loaded machine
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"deploy.py ended before {what}: {proc.communicate()[0]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"deploy.py never got to {what}: {proc.communicate()[0]}")
        time.sleep(0.1)


def terminated_in(proc: subprocess.Popen[str]) -> tuple[int, float, str]:
    """SIGTERM to the process (as `timeout` sends it); its exit code, how
    long it took to end, and what it printed."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=WITHIN_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"deploy.py still running {WITHIN_S:g} s after SIGTERM: {out}")
    return proc.returncode, time.monotonic() - started, out


def test_sigterm_while_up_waits_for_the_create_operations(
    fake_gce: FakeGce, gce_cluster_yaml: Callable[..., Path]
) -> None:
    fake_gce.latency.provision = 300.0  # the inserts' operations stay RUNNING
    proc = start_up(gce_cluster_yaml(), "--skip-setup")
    wait_until(
        proc,
        lambda: any(c.op == "zoneOperations.wait" for c in fake_gce.calls),
        "the operation wait",
    )
    code, took, out = terminated_in(proc)
    assert code == EXIT_INTERRUPTED, out
    assert "error: interrupted" in out and "Traceback" not in out
    assert took < WITHIN_S


def test_sigterm_while_up_waits_for_the_nodes_host_keys(
    fake_gce: FakeGce, gce_cluster_yaml: Callable[..., Path]
) -> None:
    fake_gce.latency.host_keys = 300.0  # the guest agents never publish in time
    # Left alone it would wait up to ssh.boot_timeout for the keys.
    proc = start_up(gce_cluster_yaml(ssh={"boot_timeout": 240}))
    wait_until(
        proc,
        lambda: any(c.op == "instances.getGuestAttributes" for c in fake_gce.calls),
        "the host-key wait",
    )
    time.sleep(1.0)  # into the wait's pauses, not only its first look
    code, took, out = terminated_in(proc)
    assert code == EXIT_INTERRUPTED, out
    assert "error: interrupted" in out and "Traceback" not in out
    assert took < WITHIN_S


def test_up_skip_setup_on_gpu_nodes_asks_no_node_and_says_the_gpus_are_unchecked(
    fake_gce: FakeGce, gce_cluster_yaml: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    config = gce_cluster_yaml(
        gce={"machine_type": "g2-standard-4", "image": DLVM, "disk_type": "pd-balanced"},
        # Short, so that asking (the old way) fails this test in seconds.
        ssh={"connect_timeout": 1, "boot_timeout": 2},
    )
    result = CliRunner().invoke(cli, ["--config", str(config), "up", "--skip-setup"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "tfc-test is up: 4 nodes running" in result.output
    assert result.output.count("unchecked (setup skipped)") == 4
    # No host key read: nothing was about to connect.
    assert [c for c in fake_gce.calls if c.op == "instances.getGuestAttributes"] == []
