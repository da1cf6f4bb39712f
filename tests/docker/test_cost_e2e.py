"""Autostop and recovery from preemption, end to end (``make e2e``).

One Spot cluster (``gce.preemptible: true``, ``autostop: 45s``) on the
docker-backed fake GCE is shared by the tests of this module, in order, to
keep CI short: each test first runs ``up`` (which starts whatever stopped
itself meanwhile), so each also runs alone.

* an idle cluster stops itself (the watcher's guest shutdown ends the
  container, which the fake records as TERMINATED) and `start` brings it
  back;
* the ps/chief node is preempted mid-`train` (async): `train` says so,
  starts it again and resumes from the last checkpoint by itself, the
  accuracy target met and at most one checkpoint interval lost; while it
  runs `status` says the job keeps the nodes busy (autostop set to 75s
  with `up --autostop`), and no node stops itself during the job;
* the same for a `run` of examples/own-program/ps_program.py, which resumes
  from its own checkpoint (TFCLUSTER_RESUME=1), with the code it started
  with (the program is edited here before the preemption), and pauses long
  enough to outlive the autostop on any machine: no node stops itself
  during it, and all do after;
* a `train --detach` nobody comes back to: once its chief ends, its ps and
  workers end by themselves and every node stops itself (the bill autostop
  exists to prevent).
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.docker.conftest import REPO, RUN_ID, free_subnets, wait_for
from tests.docker.test_gce_e2e import (
    CHECKPOINT_EVERY,
    LATENCY,
    NODES,
    STEPS,
    World,
    e2e_mapping,
    finish,
    wait_training,
)
from tests.fake_gce import FakeGce
from tests.fake_gce.docker_backend import DockerBackend

pytestmark = [pytest.mark.docker, pytest.mark.e2e]

AUTOSTOP_S = 45
# The jobs' tests set a longer one: on a loaded machine, `up` then the
# launch of a job can take most of 45 s, and a node that stopped itself
# meanwhile is (rightly) an error of the launch, not what they test.
JOB_AUTOSTOP_S = 75
GUEST_STOP = "compute.instances.guestTerminate"
# The own program's pause after each of its checkpoints (every 50 of 400
# steps). A preemption after step 100 leaves at least six pauses in the
# job, 6 x 13 s > JOB_AUTOSTOP_S: the job outlives the autostop on any
# machine, however fast.
PAUSE_S = 13


@pytest.fixture(scope="module")
def spot(
    node_image: str, wheelhouse: Path, mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("spot")
    vpc, external = free_subnets(2)
    backend = DockerBackend(
        node_image,
        prefix=f"tfc-spot-{RUN_ID}-{secrets.token_hex(2)}",
        label=f"tfcluster-test={RUN_ID}",
        vpc_subnet=f"{vpc}.0/24",
        external_subnet=f"{external}.0/24",
        keys_dir=folder / "keys",
    )
    fake = FakeGce(latency=LATENCY, backend=backend, wait_max_s=5.0).start()
    try:
        mapping = e2e_mapping(
            fake, wheelhouse, mnist_dir, boot_timeout=60, autostop=f"{AUTOSTOP_S}s"
        )
        mapping["gce"]["preemptible"] = True
        (folder / "home").mkdir()
        config = folder / "cluster.yaml"
        config.write_text(yaml.safe_dump(mapping, sort_keys=False))
        yield World(fake, backend, config, folder / "home")
        assert not fake.internal_errors, fake.internal_errors
    finally:
        fake.stop()  # closes the backend: containers and networks go


def statuses(w: World) -> dict[str, str]:
    return {n["name"]: n["status"] for n in w.status()}


def guest_stops(w: World) -> list[str]:
    """The instances that shut themselves down so far (one name per time)."""
    return [
        str(op["targetLink"]).rsplit("/", 1)[-1]
        for op in w.fake.operations()
        if op["operationType"] == GUEST_STOP
    ]


def wait_all_stopped(w: World, since: float, within: float = 120) -> None:
    """Every node stopped itself, found so by `status`, within ``within``
    seconds of ``since``."""
    left = within - (time.monotonic() - since)
    wait_for(
        lambda: set(statuses(w).values()) == {"TERMINATED"}, left, "every node to stop itself"
    )


def up(w: World, *args: str) -> None:
    out = w.deploy_ok("up", *args, timeout=600)
    assert "TERMINATED" not in out and out.count("RUNNING") == len(NODES), out


def test_an_idle_cluster_stops_itself_and_starts_again(spot: World) -> None:
    w = spot
    up(w)
    idle_since = time.monotonic()
    out = w.deploy_ok("status", timeout=120)
    assert f"autostop: {AUTOSTOP_S}s; idle " in out, out
    before = len(guest_stops(w))
    wait_all_stopped(w, idle_since)
    # The guests shut down themselves (no stop call of ours), all four.
    assert sorted(guest_stops(w)[before:]) == NODES
    assert not any(c.op == "instances.stop" for c in w.fake.calls)
    assert [n for n in NODES if w.backend.running(n)] == []
    # `start` shows the status at its end: running, and the watchers run
    # again (read from `start`'s own output: a slow machine may take a
    # good part of 45 s for another command).
    out = w.deploy_ok("start", timeout=300)
    assert f"autostop: {AUTOSTOP_S}s; idle " in out, out
    assert "TERMINATED" not in out and out.count("RUNNING") == len(NODES), out


def test_a_preempted_chief_node_is_brought_back_and_train_finishes(
    spot: World, tmp_path: Path
) -> None:
    w = spot
    up(w, "--autostop", f"{JOB_AUTOSTOP_S}s")
    stops = len(guest_stops(w))
    dest = tmp_path / "run"
    # Four times the shared job's steps: the preemption comes after the
    # first checkpoint (step 40), and the steps after it must outlast the
    # `status` call before it. The 80 left of 120 took one `status` call on
    # a fast machine; since the cnn computes in bfloat16 (1.7x faster), the
    # 200 left of 240 took one under CI's load (the job was done, at 240,
    # before the preemption).
    steps = 4 * STEPS
    proc = w.background("train", "--steps", str(steps), "--dest", str(dest))
    wait_training(w, proc, 0)
    # The nodes' watchers see the job: no idle clock runs under it. (That a
    # busy node outlives its autostop is test_autostop's, with the real
    # watcher; here the job's length depends on the machine's speed.)
    running = w.deploy_ok("status", timeout=120)
    assert "busy: a job, TensorBoard or a sync runs (not idle)" in running, running
    # Asked before the preemption is waited for: `status` takes seconds.
    wait_training(w, proc, CHECKPOINT_EVERY - 1, event="checkpoint")
    reached = max(w.chief_step("progress"), w.chief_step("checkpoint"))
    w.fake.preempt("pc-1")  # the ps and chief VM: the worst case
    out = finish(proc)
    assert proc.returncode == 0, out[-4000:]
    assert "pc-1 (TERMINATED) was preempted or stopped" in out, out[-4000:]
    assert "restart 1 of 3" in out, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    (summary_file,) = dest.glob("*/summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["steps"] == steps and summary["test_accuracy"] >= 0.9, summary
    # At most one checkpoint interval of steps lost (from the metrics).
    assert reached - CHECKPOINT_EVERY <= summary["resumed_from_step"] < steps, (reached, summary)
    # No node stopped itself under the job (the recovered pc-1 included).
    assert len(guest_stops(w)) == stops, guest_stops(w)


def test_a_preempted_user_program_resumes_from_its_own_checkpoint(
    spot: World, tmp_path: Path
) -> None:
    w = spot
    up(w, "--autostop", f"{JOB_AUTOSTOP_S}s")
    stops = len(guest_stops(w))
    workdir = tmp_path / "own-program"
    shutil.copytree(REPO / "examples" / "own-program", workdir)
    dest = tmp_path / "results"
    began = time.monotonic()
    proc = w.background(
        "run", "--workdir", str(workdir), "--dest", str(dest), "--",
        "python", "ps_program.py", "--steps", "400", "--checkpoint-every", "50",
        "--pause", str(PAUSE_S),
    )  # fmt: skip

    def checkpoints() -> int:
        log = subprocess.run(
            ["docker", "exec", "-u", "tfcluster", w.backend.container("pc-1"), "bash", "-c",
             "grep -o 'checkpoint at step [0-9]*' ~/tfcluster/logs/chief-0.log | tail -n 1"],
            capture_output=True, text=True, timeout=30,
        ).stdout  # fmt: skip
        return int(log.split()[-1]) if log.strip() else 0

    def past_100() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"run ended too early:\n{proc.communicate()[0]}")
        return checkpoints() >= 100

    wait_for(past_100, 600, "the program's checkpoint at step 100")
    reached = checkpoints()
    # Edited here meanwhile: the job resumes with the code it started with
    # (the relaunch once synced this, and the program failed at once).
    (workdir / "ps_program.py").write_text("raise SystemExit('edited after the launch')\n")
    w.fake.preempt("pc-1")
    out = finish(proc)
    ended = time.monotonic()
    assert proc.returncode == 0, out[-4000:]
    assert "pc-1 (TERMINATED) was preempted or stopped" in out, out[-4000:]
    (found,) = dest.glob("*/result.json")
    result = json.loads(found.read_text())
    assert result["steps"] == 400, result
    assert reached <= result["resumed_from_step"] < 400, (reached, result)
    assert abs(result["w"] - 3) < 0.1 and abs(result["b"] - 2) < 0.1, result
    # The job outlived the nodes' autostop (its pauses alone see to that),
    # and no node stopped itself under it ...
    assert ended - began > JOB_AUTOSTOP_S, f"the job took {ended - began:.0f} s"
    assert len(guest_stops(w)) == stops, guest_stops(w)
    # ... and once it ended, they all do.
    wait_all_stopped(w, ended, within=JOB_AUTOSTOP_S + 90)
    assert sorted(guest_stops(w)[stops:]) == NODES


def test_a_forgotten_detached_job_lets_every_node_stop(spot: World) -> None:
    """`train --detach`, and nobody attaches again. When the chief ends,
    its ps (by the chief's pid file) and its workers on the other VMs (by
    the chief's port, which stops answering) end by themselves, and every
    node then stops itself. Before, they served in `server.join()` for
    ever, their pid files kept the nodes busy, and nothing stopped them."""
    w = spot
    up(w, "--autostop", f"{AUTOSTOP_S}s")
    stops = len(guest_stops(w))
    out = w.deploy_ok("train", "--detach", "--steps", str(STEPS // 2))
    assert "started" in out, out

    def chief_ended() -> bool:
        return subprocess.run(
            ["docker", "exec", "-u", "tfcluster", w.backend.container("pc-1"),
             "test", "-e", "/home/tfcluster/tfcluster/logs/chief-0.exit"],
            capture_output=True, timeout=30,
        ).returncode == 0  # fmt: skip

    wait_for(chief_ended, 600, "the detached job's chief to end")
    wait_all_stopped(w, time.monotonic(), within=AUTOSTOP_S + 90)
    assert sorted(guest_stops(w)[stops:]) == NODES
