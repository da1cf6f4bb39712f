"""The whole product offline, as a user runs it on GCE (``make e2e``).

``deploy.py`` with provider ``gce`` drives the real google-cloud-compute
client against the fake GCE server; the fake's instances are node
containers (``DockerBackend``): the instance's ``networkIP`` is the
container's address on a private "VPC" network (the job's TF_CONFIG), its
``natIP`` an address on a second network where this machine reaches sshd.
Stopping an instance stops its container (the disk survives), deleting it
removes it.

Each test builds its own world (fake, networks, containers), checks that
``down`` leaves nothing, and the fixture sweeps whatever a failure left.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docker.conftest import REPO, RUN_ID, free_subnets, wait_for
from tests.fake_gce import FakeGce, Latency
from tests.fake_gce.docker_backend import DockerBackend, docker
from tests.fake_gce.fixtures import gce_mapping

pytestmark = [pytest.mark.docker, pytest.mark.e2e]

NODES = ["pc-1", "pc-2", "pc-3", "pc-4"]
# Seconds in each state: small, but every state is really passed through.
LATENCY = Latency(provision=0.5, staging=0.3, start=0.3, stop=0.2, delete=0.2, firewall=0.1)
# Long enough for the cnn to learn (async, 3 workers), short enough for CI.
STEPS = 120
CHECKPOINT_EVERY = 40
TRAIN_TIMEOUT = 900


@dataclass
class World:
    """One fake GCE whose instances are containers, and a cluster.yaml on it."""

    fake: FakeGce
    backend: DockerBackend
    config: Path
    home: Path

    def deploy(self, *args: str, timeout: float = TRAIN_TIMEOUT) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self._argv(args), cwd=self.home, env=self._env(), capture_output=True, text=True,
            timeout=timeout, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def deploy_ok(self, *args: str, timeout: float = TRAIN_TIMEOUT) -> str:
        done = self.deploy(*args, timeout=timeout)
        assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def background(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self._argv(args), cwd=self.home, env=self._env(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def _argv(self, args: tuple[str, ...]) -> list[str]:
        return [sys.executable, str(REPO / "deploy.py"), "--config", str(self.config), *args]

    def _env(self) -> dict[str, str]:
        return dict(os.environ, TFCLUSTER_HOME=str(self.home), COLUMNS="200")

    def status(self) -> list[dict[str, Any]]:
        return list(json.loads(self.deploy_ok("status", "--json", timeout=120)))

    def summary(self, dest: Path) -> dict[str, Any]:
        """summary.json of the one run folder that ``--dest DIR`` put in DIR."""
        (run,) = dest.glob("*/summary.json")
        return dict(json.loads(run.read_text()))

    def chief_step(self, event: str = "progress") -> int:
        """The step of the chief's last ``event`` (progress, checkpoint) in
        its log on pc-1; 0 when there is none yet."""
        out = subprocess.run(
            ["docker", "exec", "-u", "tfcluster", "-w", "/home/tfcluster",
             self.backend.container("pc-1"), "bash", "-c",
             f"grep -o '\"event\":\"{event}\"[^}}]*\"step\":[0-9]*' "
             "tfcluster/logs/chief-0.log | tail -n 1 || true"],
            capture_output=True, text=True, timeout=30,
        ).stdout  # fmt: skip
        found = re.findall(r'"step":(\d+)', out)
        return int(found[-1]) if found else 0


MakeWorld = Callable[..., World]


def e2e_mapping(
    fake: FakeGce, wheelhouse: Path, mnist_dir: Path, *, boot_timeout: float, **more: Any
) -> dict[str, Any]:
    """The cluster.yaml of the e2e tests on ``fake``: the async CNN on MNIST
    synced from ``mnist_dir``; ``more``: further top-level keys."""
    mapping = gce_mapping(
        fake.endpoint,
        name="e2e",
        ports={"ps": 2222, "worker": 2223, "chief": 2224},
        ssh={"user": "tfcluster", "boot_timeout": boot_timeout},
        setup={
            "remote_dir": "tfcluster",
            "wheelhouse": str(wheelhouse),
            "sync": [str(mnist_dir)],
        },
        job={
            "model": "cnn",
            "mode": "async",
            "steps": STEPS,
            "batch_size": 128,
            "checkpoint_every": CHECKPOINT_EVERY,
            "data_dir": f"tfcluster/{mnist_dir.name}",
        },
        **more,
    )
    mapping["gce"]["operation_timeout"] = 300
    return mapping


@pytest.fixture
def world(
    node_image: str, wheelhouse: Path, mnist_dir: Path, tmp_path: Path
) -> Iterator[MakeWorld]:
    """``world(command=(), boot_timeout=60, **overrides)``: a started fake
    GCE backed by containers, and its cluster.yaml. Afterwards removes
    whatever a test left (each test asserts what it should have left)."""
    made: list[World] = []

    def make(
        *, command: tuple[str, ...] = (), boot_timeout: float = 60, **overrides: Any
    ) -> World:
        vpc, external = free_subnets(2)
        tag = f"tfc-e2e-{RUN_ID}-{secrets.token_hex(2)}"
        backend = DockerBackend(
            node_image,
            prefix=tag,
            label=f"tfcluster-test={RUN_ID}",
            vpc_subnet=f"{vpc}.0/24",
            external_subnet=f"{external}.0/24",
            keys_dir=tmp_path / f"keys-{len(made)}",
            command=command,
        )
        fake = FakeGce(latency=LATENCY, backend=backend, wait_max_s=5.0).start()
        mapping = e2e_mapping(fake, wheelhouse, mnist_dir, boot_timeout=boot_timeout)
        for key, value in overrides.items():
            mapping[key] = value
        folder = tmp_path / f"world-{len(made)}"
        (folder / "home").mkdir(parents=True)
        config = folder / "cluster.yaml"
        config.write_text(yaml.safe_dump(mapping, sort_keys=False))
        w = World(fake, backend, config, folder / "home")
        made.append(w)
        return w

    try:
        yield make
        for w in made:
            assert not w.fake.internal_errors, w.fake.internal_errors
    finally:
        for w in made:
            w.fake.stop()  # closes the backend: containers and networks go


def host_key_pins(w: World) -> set[str]:
    known = w.home / "clusters" / "e2e" / "known_hosts"
    return set(known.read_text().splitlines())


def published_host_keys(w: World) -> set[str]:
    """``compute.<id> <type> <base64> <node>`` of every host key of every
    container, as the pins should read."""
    lines = set()
    for inst in w.fake.instances():
        out = docker("exec", w.backend.container(inst["name"]), "sh", "-c",
                     "cat /etc/ssh/ssh_host_*_key.pub")  # fmt: skip
        for key in out.splitlines():
            key_type, blob = key.split()[:2]
            lines.add(f"compute.{inst['id']} {key_type} {blob} {inst['name']}")
    return lines


def running_containers(w: World) -> list[str]:
    return [n for n in NODES if w.backend.running(n)]


def docker_ip(w: World, node: str, network: str) -> str:
    return subprocess.run(
        ["docker", "inspect", "-f",
         "{{(index .NetworkSettings.Networks \"" + network + "\").IPAddress}}",
         w.backend.container(node)],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def test_whole_lifecycle(world: MakeWorld, tmp_path: Path) -> None:
    w = world()
    # up: provision (4 instances, 4 firewall rules: gRPC and SSH each an
    # allow and a deny below it, as ssh_source_ranges is not the world),
    # install, sync.
    out = w.deploy_ok("up")
    assert sorted(i["name"] for i in w.fake.instances()) == NODES
    assert {i["status"] for i in w.fake.instances()} == {"RUNNING"}
    assert sorted(f["name"] for f in w.fake.firewalls()) == [
        "tfcluster-e2e-grpc", "tfcluster-e2e-grpc-deny", "tfcluster-e2e-ssh",
        "tfcluster-e2e-ssh-deny",
    ]
    # Host keys: the containers' own, published as guest attributes and
    # pinned under each instance's id, not trusted on first use.
    pins = host_key_pins(w)
    assert pins == published_host_keys(w), pins
    assert running_containers(w) == NODES
    for node in NODES:
        assert f"{node}: already installed" in out, out  # the image's baked venv

    # train: async, 1 ps + 3 workers + chief, TF_CONFIG on the VPC addresses.
    first = tmp_path / "first"
    w.deploy_ok("train", "--dest", str(first))
    summary = w.summary(first)
    assert (summary["mode"], summary["workers"], summary["ps"]) == ("async", 3, 1)
    assert summary["steps"] == STEPS and summary["test_accuracy"] >= 0.9, summary
    assert list(first.glob("*/loss.png")) and list(first.glob("*/checkpoints/checkpoint"))
    # fetch brings the same run folder home again.
    fetched = tmp_path / "fetched"
    w.deploy_ok("fetch", "--dest", str(fetched))
    assert w.summary(fetched) == summary

    # status --json: what GCE says, with the containers' addresses.
    status = {n["name"]: n for n in w.status()}
    assert sorted(status) == NODES
    for node in NODES:
        assert status[node]["status"] == "RUNNING"
        assert status[node]["internal_ip"] == docker_ip(w, node, w.backend.vpc)
        assert status[node]["external_ip"] == docker_ip(w, node, w.backend.external)
        assert status[node]["zone"] == "us-central1-a"
    assert set(status["pc-1"]["roles"]) == {"ps", "chief"}
    assert status["pc-2"]["roles"] == ["worker"]

    # stop: instances TERMINATED, containers stopped, disks kept.
    w.deploy_ok("stop", timeout=300)
    assert {n["status"] for n in w.status()} == {"TERMINATED"}
    assert running_containers(w) == []
    assert len(w.backend.containers()) == 4

    # start: running again, new external addresses found.
    w.deploy_ok("start", timeout=300)
    after = {n["name"]: n for n in w.status()}
    assert {n["status"] for n in after.values()} == {"RUNNING"}
    for node in NODES:
        assert after[node]["internal_ip"] == status[node]["internal_ip"]
        assert after[node]["external_ip"] != status[node]["external_ip"]
        assert after[node]["external_ip"] == docker_ip(w, node, w.backend.external)

    # train --resume: continues from the first job's last checkpoint.
    resumed = tmp_path / "resumed"
    w.deploy_ok("train", "--resume", "--steps", str(STEPS + CHECKPOINT_EVERY), "--dest",
                str(resumed))  # fmt: skip
    summary = w.summary(resumed)
    assert summary["resumed_from_step"] == STEPS, summary
    assert summary["steps"] == STEPS + CHECKPOINT_EVERY, summary
    assert host_key_pins(w) == pins  # new addresses, the same machines' pins

    # down: nothing left (the fixture checks containers too).
    w.deploy_ok("down", "--yes", timeout=300)
    assert w.fake.instances() == [] and w.fake.firewalls() == []
    assert w.backend.containers() == []


# -- faults ------------------------------------------------------------------------------


def wait_training(
    w: World, proc: subprocess.Popen[str], past_step: int, event: str = "progress"
) -> None:
    """Wait until the chief has logged ``event`` past ``past_step``."""

    def training() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"train ended too early:\n{proc.communicate()[0]}")
        return w.chief_step(event) > past_step

    wait_for(training, 600, f"the chief's {event} past step {past_step}")


def finish(proc: subprocess.Popen[str], timeout: float = TRAIN_TIMEOUT) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return out


def down_leaves_nothing(w: World) -> None:
    w.deploy_ok("down", "--yes", timeout=300)
    assert w.fake.instances() == [] and w.fake.firewalls() == []
    assert w.backend.containers() == []


def test_first_zone_exhausted_fails_over_to_the_second(world: MakeWorld) -> None:
    w = world()
    # Two instances come up in the first zone, then it runs out.
    w.fake.stockout("us-central1-a", after=2)
    done = w.deploy("up", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "us-central1-b" in done.stdout + done.stderr  # it said where it went
    assert {i["zone"].rsplit("/", 1)[-1] for i in w.fake.instances()} == {"us-central1-b"}
    # The half-created nodes of the first zone went, containers and all.
    assert running_containers(w) == NODES and len(w.backend.containers()) == 4
    assert {n["zone"] for n in w.status()} == {"us-central1-b"}
    down_leaves_nothing(w)


def test_ssh_that_never_opens_is_a_bounded_wait_and_leaves_no_orphan(world: MakeWorld) -> None:
    # Nodes whose sshd never starts: the VMs run, SSH never answers.
    w = world(command=("sleep", "infinity"), boot_timeout=8)
    started = time.monotonic()
    done = w.deploy("up", timeout=300)
    elapsed = time.monotonic() - started
    assert done.returncode == 7, done.stdout + done.stderr  # RemoteError
    message = done.stderr.strip()
    assert "Traceback" not in done.stdout + done.stderr
    assert "pc-1" in message and "8 s" in message, message
    assert elapsed < 120, f"up gave up after {elapsed:.0f} s"
    # Every node it made is found by its labels and goes with `down`.
    assert sorted(n["name"] for n in w.status()) == NODES
    down_leaves_nothing(w)


def test_lost_nodes_during_and_between_jobs(world: MakeWorld, tmp_path: Path) -> None:
    """One cluster (its `up` is the slow part of a test), three faults in
    turn: a worker VM reclaimed mid-job (the async job completes without
    it); that node found TERMINATED and restarted by `up` (a new external
    address, the same internal one, setup reaches it there); the ps and
    chief VM reclaimed mid-job (train fails within a bounded time and says
    to resume). Resuming from the checkpoint after a preemption is
    test_cost_e2e's (automatic) and test_whole_lifecycle's (train --resume)."""
    w = world()
    w.deploy_ok("up", timeout=600)
    before = {n["name"]: n for n in w.status()}

    # A worker's VM goes mid-training: the remaining workers make up its steps.
    dest = tmp_path / "run"
    proc = w.background("train", "--dest", str(dest))
    wait_training(w, proc, 10)
    w.fake.preempt("pc-3")  # worker-1's VM is reclaimed mid-training
    out = finish(proc)
    assert proc.returncode == 0, out[-4000:]
    summary = w.summary(dest)
    assert summary["steps"] == STEPS and summary["test_accuracy"] >= 0.8, summary

    # `up` finds it TERMINATED and starts it again.
    status = {n["name"]: n for n in w.status()}
    assert status["pc-3"]["status"] == "TERMINATED" and not w.backend.running("pc-3")
    out = w.deploy_ok("up", timeout=600)
    assert "pc-3" in out
    after = {n["name"]: n for n in w.status()}
    assert {n["status"] for n in after.values()} == {"RUNNING"}
    assert running_containers(w) == NODES
    assert after["pc-3"]["external_ip"] != before["pc-3"]["external_ip"]
    assert after["pc-3"]["internal_ip"] == before["pc-3"]["internal_ip"]
    assert "pc-3: already installed" in out, out  # setup reached it at its new address

    # The ps (and chief) VM goes: train notices within a bounded time and
    # says what to do, without a traceback. (The first job's chief log goes
    # first: only this job's checkpoint may count as "training".)
    docker("exec", "-u", "tfcluster", w.backend.container("pc-1"),
           "rm", "-f", "/home/tfcluster/tfcluster/logs/chief-0.log")  # fmt: skip
    proc = w.background("train", "--dest", str(tmp_path / "lost"))
    wait_training(w, proc, CHECKPOINT_EVERY - 1, event="checkpoint")
    w.fake.preempt("pc-1")
    lost_at = time.monotonic()
    out = finish(proc, timeout=300)
    waited = time.monotonic() - lost_at
    assert proc.returncode != 0, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    assert "lost contact with the chief on pc-1" in out, out[-4000:]
    assert "train --resume" in out, out[-4000:]  # says what to do
    assert waited < 120, f"train took {waited:.0f} s to notice"
    down_leaves_nothing(w)
