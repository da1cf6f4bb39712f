"""The recipe "add a provider", followed once: a new provider is its own
module (here a class in this file), one registry line (``register_provider``)
and its config section (``ToyConfig``, the ``toy:`` key of cluster.yaml);
deploy.py's up / status / stop / start / down drive it through the same code
as gce, ssh and local, never asking its name.

The toy provider keeps its nodes as records in a JSON file in the cluster's
state folder (what a cloud's API would hold) and runs commands through the
local provider's transport, as folders on this machine. Its sibling
``ToySshProvider`` is docs/architecture.md's recipe to the letter: an
``SshTransport`` with the cluster's login key (``ssh.key_file`` here), to
nodes that are real SSH servers on loopback (tests/hostile_node.py's, which
run commands with sh in a folder): `up` sets them up through it (a real
install of the venv, offline: its requirements are pip alone, and the
code synced), `exec` and `run` sync the working folder to them and run a
job there with the venv's Python, whose run folder comes home.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import paramiko
import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ConfigDict

from bench.support.loopback import free_ports
from deploy import cli
from infra.config import providers
from infra.config.loader import ClusterConfig
from infra.providers.base import Capabilities, Node, NodeProvider, NodeState, login_key
from infra.providers.local import LocalTransport
from infra.setup.commands import MARKER
from infra.state.keys import ensure_key_pair
from infra.transport.base import Transport
from tests.hostile_node import FakeNode

# The checkout: the probes below run there, as `python -m` would.
REPO = Path(__file__).resolve().parents[1]


class ToyConfig(BaseModel):
    """cluster.yaml's ``toy:`` section, as strict as the built-in ones."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    machine: str = "tin"


class ToyProvider(NodeProvider):
    """Nodes that can be created, stopped, started and deleted, for free."""

    kind = "toy"
    config_section = ToyConfig

    def capabilities(self) -> Capabilities:
        # Records in a file: nothing to install, and they cannot stop
        # themselves (autostop is refused with the default's words).
        return replace(super().capabilities(), needs_setup=False)

    @classmethod
    def config_problem(cls, config: ClusterConfig) -> tuple[tuple[str, ...], str] | None:
        if len(config.nodes) > 3:
            return ("nodes",), "provider toy has at most 3 nodes"
        return None

    @classmethod
    def gpus_per_node(cls, config: ClusterConfig) -> int:
        return 0

    @property
    def _file(self) -> Path:
        return self.state.dir / "toys.json"

    def _load(self) -> dict[str, str]:
        return json.loads(self._file.read_text()) if self._file.exists() else {}

    def _save(self, toys: dict[str, str]) -> None:
        self._file.parent.mkdir(parents=True, exist_ok=True)
        self._file.write_text(json.dumps(toys))

    def _set(self, names: Sequence[str], state: NodeState | None) -> None:
        toys = self._load()
        for name in names:
            if state is None:
                toys.pop(name, None)
            else:
                toys[name] = state.value
                (self.state.dir / "homes" / name).mkdir(parents=True, exist_ok=True)
        self._save(toys)

    def non_terminated_nodes(self) -> list[Node]:
        section = self.section
        assert isinstance(section, ToyConfig)
        return [
            Node(
                name=name,
                state=NodeState(state),
                status=state.upper(),
                internal_ip="127.0.0.1",
                machine_type=section.machine,
            )
            for name, state in sorted(self._load().items())
        ]

    def create_nodes(self, names: Sequence[str]) -> None:
        self._set(names, NodeState.RUNNING)

    def start_nodes(self, names: Sequence[str]) -> None:
        self._set(names, NodeState.RUNNING)

    def stop_nodes(self, names: Sequence[str]) -> None:
        self._set(names, NodeState.STOPPED)

    def terminate_nodes(self, names: Sequence[str]) -> None:
        self._set(names, None)

    def transport(self, nodes: Sequence[Node]) -> Transport:
        return LocalTransport([n.name for n in nodes], self.state.dir / "homes")


@pytest.fixture
def toy_config(tmp_path: Path) -> Iterator[Path]:
    # The one registry line (taken out again after the test).
    providers.register_provider("toy", ToyProvider)
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "name: toys\nprovider: toy\nnodes: [t-1, t-2]\nroles: {ps: t-1, chief: t-1, worker: t-2}\n"
        "toy: {machine: lego}\n"
    )
    yield config
    del providers.PROVIDERS["toy"]


def run(config: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--config", str(config), *args], catch_exceptions=False)
    return result.exit_code, result.output


def states(config: Path) -> list[tuple[str, str]]:
    code, out = run(config, "status", "--json")
    assert code == 0, out
    return [(n["name"], n["state"]) for n in json.loads(out)]


def machines(config: Path) -> list[str]:
    return [n["machine_type"] for n in json.loads(run(config, "status", "--json")[1])]


def test_a_registered_provider_runs_the_whole_lifecycle(toy_config: Path) -> None:
    assert states(toy_config) == [("t-1", "absent"), ("t-2", "absent")]

    code, out = run(toy_config, "up", "--dry-run")
    assert code == 0 and "plan for toys (toy):" in out and "create  t-1" in out
    assert states(toy_config) == [("t-1", "absent"), ("t-2", "absent")]

    code, out = run(toy_config, "up")
    assert code == 0 and "toys is up" in out, out
    assert states(toy_config) == [("t-1", "running"), ("t-2", "running")]
    assert machines(toy_config) == ["lego", "lego"]  # from its own section
    code, out = run(toy_config, "up")
    assert code == 0 and "nothing to do" in out

    code, out = run(toy_config, "stop")
    assert code == 0, out
    assert states(toy_config) == [("t-1", "stopped"), ("t-2", "stopped")]
    code, out = run(toy_config, "start")
    assert code == 0, out
    assert states(toy_config) == [("t-1", "running"), ("t-2", "running")]

    code, out = run(toy_config, "down", "--yes")
    # Nodes it made: `down` deletes them, in the CLI's words for that.
    assert code == 0 and "delete  t-1" in out and "deleted toys: nothing left" in out, out
    assert states(toy_config) == [("t-1", "absent"), ("t-2", "absent")]


class LoanedToyProvider(ToyProvider):
    """Toys on loan: the user's own machines, which tfcluster only reaches.
    Only its ``Capabilities`` differ; the commands follow them."""

    def capabilities(self) -> Capabilities:
        return replace(
            super().capabilities(),
            cannot_stop="loaned toys are not ours to stop",
            existing_hosts=True,
        )


def test_the_commands_follow_what_the_provider_says_its_nodes_can_do(toy_config: Path) -> None:
    providers.register_provider("toy", LoanedToyProvider)
    code, out = run(toy_config, "up")
    assert code == 0 and "toys is up" in out, out
    # No Pricing: no cost column, no estimate.
    code, out = run(toy_config, "status")
    assert code == 0 and "$/hour" not in out and "estimated cost" not in out, out
    code, out = run(toy_config, "stop")
    assert code != 0 and "loaned toys are not ours to stop" in out, out
    code, out = run(toy_config, "autostop", "30m")
    assert code == 2 and "autostop: provider toy cannot stop its nodes from inside" in out, out
    # Existing hosts: `down` releases them, in the CLI's words for that.
    code, out = run(toy_config, "down", "--yes")
    assert code == 0 and "release t-1" in out and "released toys:" in out, out


def test_the_provider_words_its_own_config_problems(toy_config: Path) -> None:
    toy_config.write_text(
        "name: toys\nprovider: toy\nnodes: [a, b, c, d]\nroles: {ps: a, chief: a, worker: b}\n"
    )
    code, out = run(toy_config, "status")
    assert code == 2
    assert out.strip() == f"error: {toy_config}: nodes: provider toy has at most 3 nodes"


def test_its_section_is_as_strict_as_the_built_in_ones(toy_config: Path) -> None:
    text = toy_config.read_text()
    toy_config.write_text(text.replace("machine: lego", "machin: lego"))
    code, out = run(toy_config, "status")
    assert code == 2
    assert out.strip() == f"error: {toy_config}: toy.machin: unknown key; did you mean 'machine'?"

    toy_config.write_text(text.replace("toy: {machine: lego}\n", ""))
    run(toy_config, "up")
    assert machines(toy_config) == ["tin", "tin"]  # left out: the section's defaults


def test_an_unregistered_name_is_refused_with_the_registered_ones(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text("name: toys\nprovider: toy\n")
    code, out = run(config, "status")
    assert code == 2
    assert out.strip() == (
        f"error: {config}: provider: 'toy' is not allowed; input should be 'gce', 'ssh' or 'local'"
    )


def test_the_local_cluster_never_loads_another_provider() -> None:
    """The registry imports a provider only when a cluster names it."""
    probe = (
        "import sys\n"
        "from infra.cluster.api import Cluster\n"
        "from infra.config.loader import default_config\n"
        "Cluster(default_config()).provider.non_terminated_nodes()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('google', 'infra.providers.'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    # local_network: the local provider's own (its tasks' network namespace).
    assert out.strip() == (
        "['infra.providers.base', 'infra.providers.local', 'infra.providers.local_network']"
    )


def test_validating_a_gce_config_loads_no_google_code() -> None:
    """cluster.yaml's validation asks the provider class (its config
    problems, its GPUs): the Compute client loads only for an API call."""
    probe = (
        "import sys\n"
        "from infra.config.loader import load_config\n"
        "from infra.setup.nodes import expected_gpus\n"
        "print(expected_gpus(load_config('examples/gce-gpu.yaml')))\n"
        "print(sorted(m for m in sys.modules if m.startswith('google')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert out.split("\n")[:2] == ["1", "[]"]


# -- the recipe's SSH transport --------------------------------------------------


class ToySshProvider(ToyProvider):
    """The toys, reached as the recipe says: over SSH, at cluster.yaml's
    ``hosts`` addresses, logging in with ``login_key`` (``ssh.key_file``).
    They are toys tfcluster made (``existing_hosts`` stays False): `down`
    deletes them, and their folder is ``setup.remote_dir`` itself."""

    kind = "toyssh"

    def capabilities(self) -> Capabilities:
        # SSH nodes get what `up` gives any: the venv installed, the code synced.
        return replace(super().capabilities(), needs_setup=True)

    def non_terminated_nodes(self) -> list[Node]:
        nodes = []
        for name, state in sorted(self._load().items()):
            host = self.config.hosts[name]
            nodes.append(
                Node(
                    name=name, state=NodeState(state), status=state.upper(),
                    internal_ip=host.address, external_ip=host.address,
                    ssh_host=host.address, ssh_port=host.port,
                )
            )  # fmt: skip
        return nodes

    def transport(self, nodes: Sequence[Node]) -> Transport:
        from infra.transport.ssh import SshTarget, SshTransport

        key_file, _ = login_key(self.config, self.state)
        return SshTransport(
            [SshTarget(n.name, n.ssh_host or "", n.ssh_port) for n in nodes],
            config=self.config, state=self.state, key_file=key_file,
        )  # fmt: skip


# The job: the worker listens on its TF_CONFIG address until it is stopped;
# the chief writes what it knows to its run folder, and which Python runs it.
JOB = """\
import json, os, pathlib, socket, sys, time
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
if task["type"] == "worker":
    port = int(config["cluster"]["worker"][task["index"]].rsplit(":", 1)[1])
    server = socket.create_server(("", port))
    time.sleep(120)
else:
    notes = pathlib.Path("notes.txt").read_text().strip()
    worker = config["cluster"]["worker"][0]
    out = pathlib.Path(os.environ["TFCLUSTER_RUN_DIR"]) / "out.txt"
    out.write_text(f"{os.environ['TFCLUSTER_TASK']} {notes} {worker} {sys.prefix}\\n")
"""


@pytest.fixture
def ssh_toys(tmp_path: Path) -> Iterator[tuple[Path, dict[str, Path], int]]:
    """cluster.yaml of two toyssh nodes (SSH servers on loopback that let
    in only the user's own key, ssh.key_file), each node's home, and the
    workers' TF_CONFIG port (free here: both nodes are this machine)."""
    key = tmp_path / "keys" / "id_ed25519"
    ensure_key_pair(key, "me")
    homes = {name: tmp_path / "nodes" / name for name in ("t-1", "t-2")}
    servers = []
    for home in homes.values():
        home.mkdir(parents=True)
        servers.append(FakeNode(paramiko.PKey.from_path(key), home=home, writable=True))
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("synced\n")
    (project / "job.py").write_text(JOB)
    # setup's install, for real but offline: pip is already in a new venv.
    (project / "requirements.txt").write_text("pip\n")
    config = project / "cluster.yaml"
    ports = free_ports(3)
    hosts = ", ".join(f"{n}: '127.0.0.1:{s.port}'" for n, s in zip(homes, servers, strict=True))
    config.write_text(
        "name: toys\nprovider: toyssh\nnodes: [t-1, t-2]\n"
        "roles: {ps: [], chief: t-1, worker: t-2}\n"
        f"hosts: {{{hosts}}}\nssh: {{key_file: {key}}}\n"
        f"ports: {{ps: {ports[0]}, worker: {ports[1]}, chief: {ports[2]}}}\n"
        "setup: {requirements: requirements.txt}\n"
    )
    providers.register_provider("toyssh", ToySshProvider)
    try:
        yield config, homes, ports[1]
    finally:
        del providers.PROVIDERS["toyssh"]
        for server in servers:
            server.close()


def test_the_recipes_provider_syncs_and_runs_a_job_through_its_transport(
    ssh_toys: tuple[Path, dict[str, Path], int],
) -> None:
    config, homes, worker_port = ssh_toys
    # up: setup through the transport, on both nodes at once: the venv
    # installed (with its marker) and the code synced.
    code, out = run(config, "up")
    assert code == 0 and "toys is up: 2 nodes running" in out, out
    for node, home in homes.items():
        (line,) = [x for x in out.splitlines() if x.startswith(f"  {node}: installed (")]
        assert ", synced " in line, out
        assert (home / "tfcluster" / "venv" / MARKER).is_file()
        assert (home / "tfcluster" / "code" / "trainer" / "catalog.py").is_file()

    # exec: the working folder goes to every node first, then the command runs there.
    code, out = run(config, "exec", "--", "cat", "notes.txt")
    assert code == 0, out
    assert sorted(line for line in out.splitlines() if " | " in line) == [
        "t-1 | synced", "t-2 | synced",
    ]  # fmt: skip

    # run: a job of one chief and one worker, each with its TF_CONFIG; the
    # worker listens on its port (the chief starts once it does), the chief
    # writes its run folder, which comes home. Their `python` is setup's venv.
    code, out = run(config, "run", "--no-ps", "--", "python", "job.py")
    assert code == 0, out
    fetched = list(Path("runs/toys").glob("*/out.txt"))
    venv = homes["t-1"] / "tfcluster" / "venv"
    assert [p.read_text() for p in fetched] == [f"chief-0 synced 127.0.0.1:{worker_port} {venv}\n"]
