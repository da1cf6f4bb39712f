"""Hostile cluster.yaml inputs: each is one short ConfigError line (exit 2
through the CLI), never a hang, a traceback, a huge read or a silent accept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from deploy import cli
from infra.config.loader import load_config, parse_config
from infra.errors import ConfigError

# A YAML bomb or a quadratic parse would hang or eat memory for far longer
# than this; a bound on a hang, not a speed test (the machine may be busy).
pytestmark = pytest.mark.timeout(120)

BASE = "name: x\n"
SSH = "name: x\nprovider: ssh\nnodes: [a, b]\nroles: {ps: a, chief: a, worker: b}\n"


def cli_error(config: Path) -> str:
    """`deploy.py --config FILE status` exits 2 with one short line; the
    ConfigError's own text (the CLI's rendering is not what is tested here)."""
    result = CliRunner().invoke(cli, ["--config", str(config), "status"], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output[:500]
    assert lines[0].startswith("error: ") and "unexpected failure" not in lines[0]
    with pytest.raises(ConfigError) as info:
        load_config(config)
    message = str(info.value)
    assert "\n" not in message and len(message) < 300 + len(str(config)), message[:500]
    return message


def yaml_error(tmp_path: Path, text: str | bytes) -> str:
    file = tmp_path / "cluster.yaml"
    if isinstance(text, bytes):
        file.write_bytes(text)
    else:
        file.write_text(text)
    return cli_error(file)


# -- what the file is -------------------------------------------------------------


def test_non_utf8_bytes(tmp_path: Path) -> None:
    assert "not UTF-8 text" in yaml_error(tmp_path, b"name: caf\xe9\n")


def test_file_over_a_megabyte(tmp_path: Path) -> None:
    message = yaml_error(tmp_path, BASE + "#" * (1 << 20) + "\n")
    assert "larger than 1 MB" in message


def test_dev_zero_is_not_read() -> None:
    assert "not a regular file" in cli_error(Path("/dev/zero"))


def test_a_fifo_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "cluster.yaml"
    os.mkfifo(fifo)
    assert "not a regular file" in cli_error(fifo)


def test_alias_bomb_is_refused_fast(tmp_path: Path) -> None:
    bomb = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n'
    for i, name in enumerate("bcdefgh"):
        prev = "abcdefgh"[i]
        bomb += f"{name}: &{name} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
    bomb += "name: *h\n"
    message = yaml_error(tmp_path, bomb)
    assert "aliases expand to more than" in message


def test_recursive_alias(tmp_path: Path) -> None:
    assert "contains it" in yaml_error(tmp_path, "name: x\njob: {args: &a [*a]}\n")


def test_deep_nesting(tmp_path: Path) -> None:
    message = yaml_error(tmp_path, "name: x\njob: {args: " + "[" * 5000 + "]" * 5000 + "}\n")
    assert "invalid YAML" in message or "nested" in message


def test_huge_integer(tmp_path: Path) -> None:
    assert "invalid YAML" in yaml_error(tmp_path, "name: x\njob: {steps: " + "9" * 5000 + "}\n")


def test_duplicate_keys(tmp_path: Path) -> None:
    message = yaml_error(tmp_path, "name: x\njob:\n  steps: 10\n  steps: 20\n")
    assert ":4:3: duplicate key 'steps'" in message


def test_anchors_and_merge_keys_still_work(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text(
        "name: x\nnodes: &n [pc-1, pc-2]\nroles: {ps: pc-1, chief: pc-1, worker: [pc-2]}\n"
        "job:\n  <<: &defaults {steps: 50, batch_size: 64}\n  steps: 70\n"
    )
    config = load_config(file)
    assert (config.job.steps, config.job.batch_size) == (70, 64)


# -- values ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE + "job: {steps: true}\n", "job.steps: True: Input should be a valid integer"),
        (
            BASE + "job: {learning_rate: .inf}\n",
            "job.learning_rate: inf: Input should be a finite number",
        ),
        (BASE + "ssh: {connect_timeout: .inf}\n", "ssh.connect_timeout: inf"),
        (BASE + "ssh: {boot_timeout: .nan}\n", "ssh.boot_timeout: nan"),
        (BASE + "gce: {preemptible: 1}\n", "gce.preemptible: 1"),
        (BASE + "ssh: {user: ''}\n", "ssh.user: '' is not a login name"),
        (BASE + 'ssh: {user: "ops\\nx: y"}\n', "ssh.user: 'ops\\nx: y' is not a login name"),
        (BASE + "ssh: {user: 'a:b'}\n", "is not a login name"),
        # `$` in a Python regex also matches before a final newline: these
        # passed, to land in GCE's ssh-keys lines and the node's scripts.
        (BASE + 'ssh: {user: "alice\\n"}\n', "ssh.user: 'alice\\n' is not a login name"),
        (BASE + 'setup: {python: "python3\\n"}\n', "is not a command name or path"),
        (BASE + 'job: {env: {"touch\\n": "1"}}\n', "is not a variable name"),
        (BASE + "setup: {python: \"python3'; touch /tmp/x; '\"}\n", "setup.python: "),
        (BASE + "setup: {python: '-c'}\n", "is not a command name or path"),
        (BASE + "setup: {remote_dir: ../x}\n", "setup.remote_dir: '../x' is not a folder"),
        (BASE + "setup: {remote_dir: a/../../b}\n", "is not a folder"),
        (BASE + "setup: {remote_dir: '~'}\n", "is not a folder"),
        (BASE + "setup: {remote_dir: '~root/x'}\n", "is not a folder"),
        (BASE + "setup: {remote_dir: /}\n", "is not a folder"),
        (BASE + "setup: {remote_dir: ''}\n", "is not a folder"),
        (SSH + "hosts: {a: 'a:b:c', b: h}\n", "hosts.a: 'a:b:c': put an IPv6 address in brackets"),
        (SSH + "hosts: {a: 'h:x', b: h}\n", "the port after ':' must be a number"),
        (SSH + f"hosts: {{a: {'h' * 300}, b: h}}\n", "hosts.a.address: 'hhhhh"),
        (SSH + "hosts: {a: 'bad host', b: h}\n", "is not a host name or IP address"),
        (SSH + "hosts: {a: '[nope]:22', b: h}\n", "in brackets is not an IPv6 address"),
        (
            SSH + "hosts: {a: {address: h, internal_address: 'x;y'}, b: h}\n",
            "hosts.a.internal_address",
        ),
        (BASE + "nodes: [" + "a" * 5000 + "]\n", "nodes: 'aaaa"),
        (BASE + "job: {mode: " + "m" * 5000 + "}\n", "is not a mode"),
    ],
)
def test_bad_values_are_refused_in_one_short_line(tmp_path: Path, text: str, expected: str) -> None:
    message = yaml_error(tmp_path, text)
    assert expected in message
    assert len(message) < 300 + len(str(tmp_path))


def test_unknown_keys_still_get_did_you_mean(tmp_path: Path) -> None:
    assert "unknown key; did you mean 'steps'?" in yaml_error(tmp_path, BASE + "job: {stepz: 1}\n")
    message = yaml_error(tmp_path, BASE + "job: {" + "k" * 1000 + ": 1}\n")
    assert "unknown key" in message


def test_hosts_ipv6_and_names() -> None:
    config = parse_config(
        {
            "name": "x",
            "provider": "ssh",
            "nodes": ["a", "b", "c"],
            "roles": {"ps": "a", "chief": "a", "worker": ["b", "c"]},
            "hosts": {
                "a": "[::1]:2201",
                "b": {"address": "2001:db8::7", "internal_address": "[fd00::7]"},
                "c": "node_3.example.com",
            },
        },
        source="c.yaml",
    )
    assert (config.hosts["a"].address, config.hosts["a"].port) == ("::1", 2201)
    assert config.hosts["b"].address == "2001:db8::7"
    # TF_CONFIG's "host:port" needs IPv6 in brackets; SSH takes the bare address.
    assert config.hosts["b"].internal_address == "[fd00::7]"
    assert config.hosts["a"].task_host() == "[::1]"
    assert config.hosts["c"].port == 22
    assert config.hosts["c"].task_host() == "node_3.example.com"


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("~/work/tf", "work/tf"),
        ("~//tf", "tf"),
        ("tf/", "tf"),
        ("./a//b", "a/b"),
        ("/srv/tf", "/srv/tf"),
    ],
)
def test_remote_dir_has_one_meaning(given: str, used: str) -> None:
    config = parse_config({"name": "x", "setup": {"remote_dir": given}}, source="c.yaml")
    assert config.setup.remote_dir == used


def test_good_user_and_python() -> None:
    config = parse_config(
        {
            "name": "x",
            "ssh": {"user": "ci_runner-2"},
            "setup": {"python": "/opt/py3.11/bin/python3"},
        },
        source="c.yaml",
    )
    assert config.ssh.user == "ci_runner-2"
    assert config.setup.python == "/opt/py3.11/bin/python3"


def test_errors_from_parse_config_are_config_errors() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"name": "x", "ssh": {"user": "a\nb"}}, source="c.yaml")
    assert info.value.exit_code == 2 and "\n" not in str(info.value)


def test_a_final_newline_is_no_part_of_a_name() -> None:
    """`deploy.py sweep --env $'touch\\n=1'` ran `touch` on the node: the
    key's final newline passed `^...$` and broke the start script's line.
    Every name check anchors at the very end of the text."""
    from infra.config.loader import check_env_name
    from infra.providers.gce.checks import _METADATA_KEY
    from infra.spec.job import is_run_id

    assert check_env_name("touch\n") is not None
    assert not is_run_id("run-1\n")
    assert not _METADATA_KEY.match("startup-script\n")


@pytest.mark.parametrize(
    "text",
    [
        BASE + 'job: {env: {A: "\\ud800"}}\n',
        BASE + 'gce: {metadata: {k: "x\\udfff"}}\n',
        BASE + '"\\ud800": 1\n',
    ],
)
def test_a_lone_surrogate_is_one_line(tmp_path: Path, text: str) -> None:
    """YAML's "\\ud800" makes a string Python cannot encode: `up
    --dry-run` crashed on it in gce.metadata (exit 70, a traceback)."""
    message = yaml_error(tmp_path, text)
    assert "a lone surrogate" in message and "\n" not in message.strip(), message


@pytest.mark.parametrize("raw", ["\x1b[2J", "\x07", "\x00"], ids=["esc", "bel", "nul"])
def test_a_raw_control_character_is_one_line(tmp_path: Path, raw: str) -> None:
    """YAML's reader refuses them as it is made, before the parse: that
    was outside parse_yaml's try (deploy.py: "a bug", exit 70; python -m
    tfcluster_cli.compose: a traceback)."""
    message = yaml_error(tmp_path, f'name: x\n"{raw}k": 1\n')
    assert "invalid YAML" in message and "special characters" in message, message
