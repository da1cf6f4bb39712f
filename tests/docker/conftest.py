"""Fixtures of the docker tests: node images, throwaway sshd containers and
a docker-compose cluster, each removed again however the test ends.

Every container carries the label ``tfcluster-test=<run id>`` and every
compose project is named after the run, so a crashed run can be cleaned by
hand with ``docker rm -f $(docker ps -aq -f label=tfcluster-test)`` and two
runs (or a user's own ``make cluster-up``) never collide.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.loader import ClusterConfig, load_config
from infra.providers.base import remote_root
from infra.state.folder import ClusterState
from infra.state.keys import ensure_key_pair
from infra.transport.ssh import SshTarget, SshTransport
from tests.ports import free_port, free_ports

REPO = Path(__file__).resolve().parents[2]
RUN_ID = f"{os.getpid()}-{secrets.token_hex(3)}"
LABEL = f"tfcluster-test={RUN_ID}"
NODE_IMAGE = os.environ.get("TFCLUSTER_TEST_IMAGE", "tfcluster/node:local")
BARE_IMAGE = os.environ.get("TFCLUSTER_TEST_BARE_IMAGE", "tfcluster/node-bare:local")


def _docker(*args: str, check: bool = True, timeout: float = 120) -> str:
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def compose_command() -> list[str]:
    """``docker compose`` (v2) when there, else ``docker-compose`` (v1)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail("neither `docker compose` nor `docker-compose` is installed")


@pytest.fixture(scope="session")
def docker_ok() -> None:
    if shutil.which("docker") is None:
        pytest.skip("no docker client")
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.skip("docker does not answer")


def _build(image: str, bake: bool) -> str:
    env = dict(os.environ, NODE_IMAGE=image, BAKE_VENV="1" if bake else "0")
    env.setdefault("PYTHON", str(REPO / ".venv" / "bin" / "python"))
    done = subprocess.run(
        ["bash", str(REPO / "docker" / "build-node-image.sh")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if done.returncode != 0:
        pytest.fail(f"building {image} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return image


@pytest.fixture(scope="session")
def node_image(docker_ok: None) -> str:
    """The node image with the trainer's venv baked in (built once, cached)."""
    return _build(NODE_IMAGE, bake=True)


@pytest.fixture(scope="session")
def bare_image(docker_ok: None) -> str:
    """The node image without a venv: a fresh VM that `up` must install."""
    return _build(BARE_IMAGE, bake=False)


@pytest.fixture(scope="session")
def wheelhouse(docker_ok: None) -> Path:
    done = subprocess.run(
        ["bash", str(REPO / "docker" / "build-wheelhouse.sh")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if done.returncode != 0:
        pytest.fail(f"building the wheelhouse failed: {done.stderr[-3000:]}")
    return REPO / ".cache" / "wheelhouse"


@pytest.fixture(scope="session")
def node_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A key pair the test nodes authorize: (private key, public line)."""
    key = tmp_path_factory.mktemp("node-key") / "id_ed25519"
    return key, ensure_key_pair(key, "tfcluster-test")


@pytest.fixture(scope="session", autouse=True)
def _sweep_containers() -> Iterator[None]:
    """Whatever a test left behind with this run's label goes at the end."""
    yield
    if shutil.which("docker") is None:
        return
    left = _docker("ps", "-aq", "-f", f"label={LABEL}", check=False).split()
    if left:
        _docker("rm", "-f", *left, check=False)


@dataclass
class NodeContainer:
    """One throwaway node: a container whose sshd is on 127.0.0.1:port."""

    name: str
    port: int
    image: str

    def target(self, node: str = "pc-1") -> SshTarget:
        return SshTarget(node, "127.0.0.1", self.port)

    def exec(self, *command: str, user: str = "tfcluster") -> str:
        return _docker("exec", "-u", user, self.name, *command)

    def remove(self) -> None:
        _docker("rm", "-f", self.name, check=False)


StartNode = Callable[..., NodeContainer]


@pytest.fixture
def start_node(docker_ok: None, node_key: tuple[Path, str]) -> Iterator[StartNode]:
    """Factory: ``start_node(image, port=None, authorized=None)`` runs one
    node container (removed after the test, also on failure)."""
    started: list[NodeContainer] = []

    def start(
        image: str, *, port: int | None = None, authorized: str | None = None
    ) -> NodeContainer:
        name = f"tfcluster-test-{RUN_ID}-{len(started)}-{secrets.token_hex(2)}"
        port = port or free_port()
        node = NodeContainer(name, port, image)
        started.append(node)
        _docker(
            "run", "-d", "--name", name, "--label", LABEL,
            "-p", f"127.0.0.1:{port}:22",
            "-e", f"AUTHORIZED_KEYS={authorized or node_key[1]}",
            image,
        )  # fmt: skip
        return node

    yield start
    for node in started:
        node.remove()


def ssh_config(
    name: str, hosts: dict[str, dict[str, object]], key: Path, **extra: object
) -> dict[str, object]:
    """A provider-ssh cluster.yaml (as a dict) for test nodes."""
    nodes = list(hosts)
    data: dict[str, object] = {
        "name": name,
        "provider": "ssh",
        "nodes": nodes,
        "roles": {
            "ps": nodes[0],
            "chief": nodes[0],
            "worker": nodes[1:] or [],
        },
        "hosts": hosts,
        "ssh": {"key_file": str(key), "boot_timeout": 60},
    }
    if len(nodes) == 1:
        data["roles"] = {"ps": [], "chief": nodes[0], "worker": []}
        data["job"] = {"mode": "single"}
    data.update(extra)
    return data


def cluster_root(config_path: Path, home: Path) -> str:
    """The cluster's folder on its nodes as the library names it for the
    state in ``home`` (provider ssh: ``tfcluster/<name>-<id>``, relative to
    the login's home)."""
    from infra.cluster.api import Cluster

    config = load_config(config_path)
    return remote_root(Cluster(config, ClusterState(config.name, home=home)).provider)


def config_file(folder: Path, data: dict[str, object]) -> Path:
    """``data`` written as ``folder``/cluster.yaml."""
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def write_config(folder: Path, data: dict[str, object]) -> ClusterConfig:
    return load_config(config_file(folder, data))


def transport_for(
    config: ClusterConfig, key: Path, targets: list[SshTarget], home: Path
) -> SshTransport:
    return SshTransport(
        targets, config=config, state=ClusterState(config.name, home=home), key_file=key
    )


@dataclass
class ComposeCluster:
    """A running docker-compose cluster of the node image."""

    project: str
    env: dict[str, str]
    ports: dict[str, int]
    internal: dict[str, str]
    compose: list[str] = field(default_factory=list)

    def run(self, *args: str, timeout: float = 180) -> str:
        done = subprocess.run(
            [*self.compose, "-p", self.project, "-f", str(REPO / "docker-compose.yml"), *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"compose {' '.join(args)} failed: {done.stderr[-2000:]}")
        return done.stdout

    def container(self, node: str) -> str:
        return self.run("ps", "-q", node).strip()

    def hosts(self) -> dict[str, dict[str, object]]:
        return {
            node: {"address": "127.0.0.1", "port": port, "internal_address": self.internal[node]}
            for node, port in self.ports.items()
        }

    def config(self, name: str, key_file: Path, nodes: list[str] | None = None) -> dict[str, Any]:
        """examples/compose.yaml on this cluster (its ports and addresses, the
        test's key, the prepared wheelhouse), named ``name``, on ``nodes``
        (default all), syncing no data: a test changes what it needs, then
        ``config_file``."""
        data = yaml.safe_load((REPO / "examples" / "compose.yaml").read_text())
        data["name"] = name
        hosts = self.hosts()
        if nodes is not None:
            data["nodes"] = nodes
            hosts = {n: h for n, h in hosts.items() if n in nodes}
        data["hosts"] = hosts
        data["ssh"]["key_file"] = str(key_file)
        data["setup"]["wheelhouse"] = str(REPO / ".cache" / "wheelhouse")
        data["setup"]["sync"] = []
        return data


def free_subnets(count: int = 1) -> list[str]:
    """``count`` /24 prefixes (``10.x.y``) no docker network uses yet."""
    used = _docker(
        "network", "inspect", "-f", "{{range .IPAM.Config}}{{.Subnet}} {{end}}",
        *_docker("network", "ls", "-q").split(),
        check=False,
    )  # fmt: skip
    prefixes = (f"10.{second}.{third}" for second in range(231, 251) for third in range(0, 256, 17))
    found = [prefix for prefix in prefixes if f"{prefix}.0/" not in used]
    if len(found) < count:
        pytest.fail("no free 10.x subnet for the test cluster")
    return found[:count]


def _free_subnet() -> str:
    return free_subnets(1)[0]


@pytest.fixture(scope="module")
def compose_cluster(node_image: str, node_key: tuple[Path, str]) -> Iterator[ComposeCluster]:
    """pc-1..pc-4 of docker-compose.yml under a project of this run, SSH on
    free loopback ports; ``down -v`` afterwards, also on failure."""
    prefix = _free_subnet()
    ports = dict(zip([f"pc-{i}" for i in range(1, 5)], free_ports(4), strict=True))
    env = dict(
        os.environ,
        TFCLUSTER_NODE_IMAGE=node_image,
        TFCLUSTER_AUTHORIZED_KEYS=node_key[1],
        TFCLUSTER_NET=prefix,
        **{f"TFCLUSTER_SSH_PORT_{i}": str(ports[f"pc-{i}"]) for i in range(1, 5)},
    )
    cluster = ComposeCluster(
        project=f"tfct{RUN_ID.replace('-', '')}",
        env=env,
        ports=ports,
        internal={f"pc-{i}": f"{prefix}.1{i}" for i in range(1, 5)},
        compose=compose_command(),
    )
    try:
        cluster.run("up", "-d")
        yield cluster
    finally:
        try:
            cluster.run("down", "-v", "--remove-orphans", "-t", "2")
        except Exception as exc:
            print(f"compose down failed: {exc}")


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)
