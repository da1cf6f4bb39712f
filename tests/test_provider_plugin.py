"""The recipe "add a provider", followed once: a new provider is its own
module (here a class in this file), one registry line (``register_provider``)
and its config section (``ToyConfig``, the ``toy:`` key of cluster.yaml);
deploy.py's up / status / stop / start / down drive it through the same code
as gce, ssh and local, never asking its name.

The toy provider keeps its nodes as records in a JSON file in the cluster's
state folder (what a cloud's API would hold) and runs commands through the
local provider's transport, as folders on this machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ConfigDict

from deploy import cli
from infra import providers
from infra.config import ClusterConfig
from infra.providers.base import Node, NodeProvider, NodeState
from infra.providers.local import LocalTransport
from infra.transport import Transport

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
    needs_setup = False
    down_verb = "scrap"
    down_question = "scrap these toys?"
    down_done = "scrapped {name}"

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
        section = self.section()
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
    assert code == 0 and "scrap   t-1" in out and "scrapped toys" in out, out
    assert states(toy_config) == [("t-1", "absent"), ("t-2", "absent")]


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
        "from infra.cluster import Cluster\n"
        "from infra.config import default_config\n"
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
        "from infra.config import load_config\n"
        "from infra.setup import expected_gpus\n"
        "print(expected_gpus(load_config('examples/gce-gpu.yaml')))\n"
        "print(sorted(m for m in sys.modules if m.startswith('google')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert out.split("\n")[:2] == ["1", "[]"]
