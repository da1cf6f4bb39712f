"""``python -m tfcluster_cli.compose`` (the scripts' command line of
docker/ and mk/) given hostile input, as a real process: one ``error:``
line, the error class's exit code, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest

from infra.errors import ConfigError, StateError
from infra.state.folder import ClusterState
from infra.transport.host_keys import known_hosts_name

REPO = Path(__file__).resolve().parents[1]


def compose(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TFCLUSTER_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "tfcluster_cli.compose", *args],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=60,
    )  # fmt: skip


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# A host key line as ssh pins it (the key is real: known_hosts is parsed).
KEY = paramiko.RSAKey.generate(1024)
PINNED = f"{known_hosts_name('127.0.0.1', 22201)} ssh-rsa {KEY.get_base64()}\n"


@pytest.fixture
def ssh_config(tmp_path: Path) -> Path:
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "name: hostile\nprovider: ssh\nnodes: [pc-1, pc-2]\n"
        "roles: {chief: pc-1, worker: pc-2}\n"
        "hosts:\n  pc-1: {address: 127.0.0.1, port: 22201}\n"
        "  pc-2: {address: 127.0.0.1, port: 22202}\n"
    )
    return config


def test_plan_is_a_command_of_its_own(tmp_path: Path, ssh_config: Path) -> None:
    """The old ``python -m infra.setup plan --config FILE`` is ``compose plan``
    (the module's docstring names it beside marker): the whole plan as JSON,
    its fingerprint the marker."""
    marker = compose("marker", "--config", str(ssh_config), home=tmp_path)
    plan = compose("plan", "--config", str(ssh_config), home=tmp_path)
    assert marker.returncode == 0 and plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["fingerprint"] == marker.stdout.strip()


@pytest.mark.parametrize("node", ["[red]x[/red]", "$(touch pwned);`id`", "pc-9"])
def test_forget_host_of_an_unknown_node_is_refused(
    tmp_path: Path, ssh_config: Path, node: str
) -> None:
    """A typo'd or hostile NODE is named literally and refused, as
    ``deploy.py forget-host`` refuses it; no pinned key is touched."""
    state = ClusterState("hostile", home=tmp_path)
    state.known_hosts.parent.mkdir(parents=True, exist_ok=True)
    state.known_hosts.write_text(PINNED)
    result = compose("forget-host", "--config", str(ssh_config), node, home=tmp_path)
    line = one_error_line(result)
    assert node in line and result.returncode == ConfigError.exit_code
    assert state.known_hosts.read_text() == PINNED
    assert not (REPO / "pwned").exists()


def test_forget_host_of_a_known_node_still_forgets_it(tmp_path: Path, ssh_config: Path) -> None:
    state = ClusterState("hostile", home=tmp_path)
    state.known_hosts.parent.mkdir(parents=True, exist_ok=True)
    state.known_hosts.write_text(PINNED)
    result = compose("forget-host", "--config", str(ssh_config), "pc-1", home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "pc-1: forgot the host key" in result.stdout
    assert state.known_hosts.read_text().strip() == ""


def test_an_unusable_state_folder_is_one_line_not_a_traceback(
    tmp_path: Path, ssh_config: Path
) -> None:
    """TFCLUSTER_HOME under a regular file: the key cannot be made there."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = compose("public-key", "--config", str(ssh_config), home=blocker / "home")
    line = one_error_line(result)
    assert str(blocker) in line and result.returncode == StateError.exit_code


@pytest.mark.parametrize(
    "content, code",
    [(None, ConfigError.exit_code), ("name: x\nbogus: 1\n", ConfigError.exit_code)],
    ids=["missing", "unknown key"],
)
def test_a_bad_config_is_one_line(tmp_path: Path, content: str | None, code: int) -> None:
    config = tmp_path / "cluster.yaml"
    if content is not None:
        config.write_text(content)
    for command in ("marker", "plan", "public-key", "forget-host"):
        result = compose(command, "--config", str(config), home=tmp_path)
        one_error_line(result)
        assert result.returncode == code, (command, result.stderr)


def test_an_error_line_carries_no_terminal_control(tmp_path: Path) -> None:
    """The path is the caller's text (deploy.py's errors pass through
    node_text too): an OSC sequence in it must not reach the terminal."""
    result = compose("marker", "--config", str(tmp_path / "\x1b]0;pwned\x07x.yaml"), home=tmp_path)
    line = one_error_line(result)
    assert "x.yaml: no such file" in line and "\x1b" not in line and "\x07" not in line
    assert result.returncode == ConfigError.exit_code


@pytest.mark.parametrize("key_file", ["folder", "missing"])
def test_public_key_of_an_unreadable_key_file_is_a_config_error(
    tmp_path: Path, key_file: str
) -> None:
    """ssh.key_file naming a folder was an OSError: deploy.py called it a
    bug (exit 70); it is the config's fault, as a missing file is."""
    (tmp_path / "folder").mkdir()
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "name: k\nprovider: ssh\nnodes: [a]\nroles: {chief: a, worker: []}\n"
        f"hosts: {{a: {{address: 127.0.0.1}}}}\nssh: {{key_file: {tmp_path / key_file}}}\n"
    )
    result = compose("public-key", "--config", str(config), home=tmp_path / "home")
    line = one_error_line(result)
    assert str(tmp_path / key_file) in line and result.returncode == ConfigError.exit_code


def test_no_command_is_the_help(tmp_path: Path) -> None:
    result = compose(home=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "Commands:\n" in result.stderr and "  plan " in result.stderr


def test_forget_host_of_a_node_without_an_address_says_where_its_key_is(tmp_path: Path) -> None:
    """A local (or gce) node's key is pinned under its machine's name, not a
    ``hosts:`` address: refused in one line that names the command that
    knows, never a silent success."""
    config = tmp_path / "local.yaml"
    config.write_text(
        "name: hostile\nprovider: local\nnodes: [pc-1, pc-2]\n"
        "roles: {ps: [], chief: pc-1, worker: [pc-2]}\n"
    )
    result = compose("forget-host", "--config", str(config), "pc-1", home=tmp_path)
    line = one_error_line(result)
    assert result.returncode == ConfigError.exit_code
    assert "pc-1 has no hosts: address" in line and "deploy.py forget-host pc-1" in line
