"""GPU nodes that really use their GPUs, and a node image's own TensorFlow
(issue 18): the commands of infra/node/probes.py run by real bash, their
parsers (infra/node/facts.py) on recorded output, and setup's use of both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infra.config.loader import ClusterConfig, parse_config
from infra.errors import RemoteError
from infra.node import probes
from infra.node.facts import GpuCheck, parse_gpu_check, parse_system_tensorflow
from infra.providers.local import LocalTransport
from infra.setup.commands import install_command, probe_command
from infra.setup.install import _image_tensorflow
from infra.setup.nodes import _check_gpus, expected_gpus, install_plan
from infra.setup.report import NodeSetup
from infra.transport.base import NodeLayout

RECORDED = Path(__file__).parent / "recorded"
DLVM = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11"
PINNED = next(
    line.split("==", 1)[1].strip()
    for line in (Path(__file__).parents[1] / "trainer/requirements.txt").read_text().splitlines()
    if line.startswith("tensorflow-cpu==")
)


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def gce_config(tmp_path: Path, setup: dict[str, str] | None = None, **gce: object
               ) -> ClusterConfig:
    data: dict[str, object] = {
        "name": "t",
        "provider": "gce",
        "nodes": ["pc-1"],
        "roles": {"ps": [], "chief": "pc-1", "worker": []},
        "job": {"mode": "single"},
        "gce": {"project": "p", "image": DLVM, **gce},
        "setup": setup or {},
    }
    return parse_config(data, source="test", base_dir=tmp_path)


def local(tmp_path: Path) -> LocalTransport:
    (tmp_path / "homes" / "pc-1").mkdir(parents=True)
    return LocalTransport(["pc-1"], tmp_path / "homes")


# -- parsers on recorded output -----------------------------------------------------------


def test_gpu_check_parser_on_recorded_output() -> None:
    assert parse_gpu_check(recorded("gpu-check-cpu-only.txt")) == GpuCheck(False, 0)
    assert parse_gpu_check(recorded("gpu-check-two-t4.txt")) == GpuCheck(True, 2)
    assert parse_gpu_check(recorded("gpu-check-no-cuda-libs.txt")) == GpuCheck(True, 0)
    assert parse_gpu_check("@tfcluster driver yes\n@tfcluster tf-gpus error\n") == GpuCheck(
        True, None
    )


def test_system_tensorflow_parser_on_recorded_output() -> None:
    assert parse_system_tensorflow(recorded("system-tensorflow-cpu.txt")) == "2.21.0"
    assert parse_system_tensorflow(recorded("system-tensorflow-none.txt")) is None
    # Node text: a hostile "version" is not taken.
    assert parse_system_tensorflow("@tfcluster system-tensorflow $(reboot)\n") is None


# -- the image's own TensorFlow --------------------------------------------------------------


def test_the_plan_with_the_images_tensorflow_installs_everything_else(tmp_path: Path) -> None:
    plan = install_plan(gce_config(tmp_path, machine_type="g2-standard-4"))
    assert plan.gpu and plan.tensorflow == PINNED
    image = plan.with_system_tf()
    pins = [line for line in image.requirements.splitlines() if not line.startswith("#")]
    assert not any("tensorflow" in line for line in pins) and "keras==" in image.requirements
    assert image.fingerprint != plan.fingerprint and image.tensorflow is None
    script = install_command(NodeLayout("tf", "tf/code", "tf/venv/bin/python", "r", "l"),
                             image, None)
    assert "-m venv --system-site-packages" in script
    assert "include-system-site-packages = true" in script
    assert "uninstall" not in script


def test_setup_uses_the_images_tensorflow_only_at_the_pinned_version(tmp_path: Path) -> None:
    transport = local(tmp_path)
    # This machine's venv has tensorflow-cpu at the pinned version: a real
    # Python with TensorFlow, as a Deep Learning VM image's is.
    config = gce_config(tmp_path, setup={"python": sys.executable})
    plan = install_plan(config)
    report = NodeSetup("pc-1")
    assert _image_tensorflow(transport, "pc-1", config, plan, report).system_tf
    assert report.system_tf == PINNED and f"the image's TensorFlow {PINNED}" in report.line()
    bare = gce_config(tmp_path, setup={"python": "/usr/bin/python3"})
    assert _image_tensorflow(transport, "pc-1", bare, plan, NodeSetup("pc-1")) is plan


def test_a_venv_made_with_the_images_tensorflow_counts_as_installed(tmp_path: Path) -> None:
    plan = install_plan(gce_config(tmp_path))
    image = plan.with_system_tf()
    home = tmp_path / "home"
    (home / "tf/venv/bin").mkdir(parents=True)
    (home / "tf/venv/bin/python").symlink_to(sys.executable)
    layout = NodeLayout("tf", "tf/code", "tf/venv/bin/python", "tf/runs", "tf/logs")

    def probe(marker: str) -> str:
        (home / "tf/venv/.tfcluster-install").write_text(marker + "\n")
        out = subprocess.run(
            ["bash", "-c", probe_command(layout, plan.fingerprint, (), image.fingerprint)],
            cwd=home, capture_output=True, text=True, check=True,
        )
        return out.stdout

    assert "@tfcluster installed yes" in probe(image.fingerprint)
    assert "@tfcluster installed yes" in probe(plan.fingerprint)
    assert "@tfcluster installed no" in probe("sha256:other")


# -- TensorFlow must see the GPUs ----------------------------------------------------------


def _python_printing(tmp_path: Path, name: str, lines: str) -> str:
    """A stand-in for the node venv's python on a GPU VM (there is no GPU
    here): prints what ``probes.gpu_check``'s TensorFlow line would."""
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\nprintf '{lines}'\n")
    script.chmod(0o755)
    return str(script)


def test_up_fails_in_one_line_when_tensorflow_sees_fewer_gpus(tmp_path: Path) -> None:
    transport = local(tmp_path)
    config = gce_config(tmp_path, machine_type="n1-standard-8",
                        accelerator={"type": "nvidia-tesla-t4", "count": 2})
    assert expected_gpus(config) == 2
    none = NodeLayout("tf", "tf/code", _python_printing(tmp_path, "none",
                                                         "@tfcluster tf-gpus 0\\n"), "r", "l")
    with pytest.raises(RemoteError) as caught:
        _check_gpus(transport, "pc-1", config, none, lambda node, what: None)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("pc-1: TensorFlow sees 0 of its 2 GPUs: the NVIDIA driver")
    assert "billed" in (caught.value.hint or "")
    two = NodeLayout("tf", "tf/code", _python_printing(tmp_path, "two",
                                                        "@tfcluster tf-gpus 2\\n"), "r", "l")
    assert _check_gpus(transport, "pc-1", config, two, lambda node, what: None) == 2


def test_the_gpu_check_waits_for_the_driver_only_on_a_deep_learning_image() -> None:
    layout = NodeLayout("tf", "tf/code", "tf/venv/bin/python", "r", "l")
    script = probes.gpu_check(layout, wait_s=60)
    assert "if [ -d /opt/deeplearning ]" in script and "-lt 60" in script
    assert "list_physical_devices(" in script


def test_gpu_nodes_are_the_accelerator_and_the_gpu_machine_types(tmp_path: Path) -> None:
    assert expected_gpus(gce_config(tmp_path, machine_type="g2-standard-24")) == 2
    assert expected_gpus(gce_config(tmp_path)) == 0


def test_tasks_on_gpu_nodes_are_told_to_require_a_gpu(tmp_path: Path) -> None:
    """The trainer's --require-gpu by environment (trainer/flags.py): set for
    every task of a cluster whose nodes have GPUs, and only there."""
    from infra.providers.base import get_provider
    from infra.state.folder import ClusterState

    def env(config: ClusterConfig) -> dict[str, str]:
        return get_provider(config, ClusterState(config.name, home=tmp_path)).task_env()

    t4 = {"type": "nvidia-tesla-t4", "count": 1}
    assert env(gce_config(tmp_path, machine_type="n1-standard-4", accelerator=t4)) == {
        "TFCLUSTER_REQUIRE_GPU": "1"
    }
    assert env(gce_config(tmp_path, machine_type="g2-standard-24"))["TFCLUSTER_REQUIRE_GPU"] == "1"
    assert "TFCLUSTER_REQUIRE_GPU" not in env(gce_config(tmp_path, image="debian-cloud/debian-12"))
