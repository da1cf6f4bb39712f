"""cluster.yaml validation: every mistake is one line naming file, key and fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra.config.loader import default_config, load_config, parse_config
from infra.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def error_for(data: object) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, source="cluster.yaml")
    message = str(info.value)
    assert "\n" not in message
    assert info.value.exit_code == 2
    return message


def test_shipped_configs_are_valid() -> None:
    gce = load_config(REPO / "cluster.yaml")
    assert gce.provider == "gce"
    assert gce.nodes == ["pc-1", "pc-2", "pc-3", "pc-4"]
    assert gce.roles.ps == ["pc-1"] and gce.roles.chief == ["pc-1"]
    assert gce.roles.worker == ["pc-2", "pc-3", "pc-4"]
    local = load_config(REPO / "examples" / "local.yaml")
    exclude = {"base_dir"}
    assert local.model_dump(exclude=exclude) == default_config().model_dump(exclude=exclude)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"name": "x", "gce": {"zonse": ["us-central1-a"]}}, "gce.zonse: unknown key; did you mean 'zones'?"),
        ({"nme": "x"}, "nme: unknown key; did you mean 'name'?"),
        ({"name": "x", "hosts": {"pc-1": {"adress": "h"}}}, "hosts.pc-1.adress: unknown key; did you mean 'address'?"),
        ({"name": "x", "provider": "gcp"}, "provider: 'gcp' is not allowed"),
        ({"name": "x", "roles": {"worker": ["pc-9"]}}, "roles.worker: 'pc-9' is not one of the nodes"),
        ({"name": "x", "roles": {"ps": "pc-2"}}, "roles.ps: pc-2 is both ps and worker"),
        ({"name": "x", "roles": {"chief": ["pc-1", "pc-2"]}}, "roles.chief: name exactly one chief"),
        ({"name": "x", "ports": {"ps": 80}}, "ports.ps: 80"),
        ({"name": "x", "ports": {"ps": 70000}}, "ports.ps: 70000"),
        ({"name": "x", "ports": {"chief": 2222}}, "ports: ps, worker and chief need three different ports"),
        ({"name": "My_Cluster"}, "name: 'My_Cluster' is not a usable cluster name"),
        ({"name": "x", "nodes": ["PC-1"]}, "nodes: 'PC-1' is not a valid node name"),
        ({"name": "x", "provider": "ssh"}, "hosts: provider ssh needs an address for every node"),
        ({"name": "x", "gce": {"zones": ["us-central1"]}}, "gce.zones: 'us-central1' is not a zone name"),
        ({"name": "x", "gce": {"ssh_source_ranges": ["everyone"]}}, "gce.ssh_source_ranges: 'everyone' is not a CIDR range"),
        ({"name": "x", "job": {"steps": "many"}}, "job.steps: 'many'"),
        ({"name": "x", "job": {"model": "resnet"}}, "job.model: 'resnet' is not a model; choose one of cnn, convnet, dae, sdae"),
        ({}, "name: required key is missing"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_bad_config_is_one_clear_line(data: object, expected: str) -> None:
    message = error_for(data)
    assert message.startswith("cluster.yaml: ")
    assert expected in message


def test_sync_mode_needs_no_ps() -> None:
    config = parse_config(
        {"name": "x", "roles": {"ps": []}, "job": {"mode": "sync"}}, source="c.yaml"
    )
    assert config.roles.ps == []


@pytest.mark.parametrize("roles", [{"ps": []}, {"chief": "pc-1", "worker": ["pc-2", "pc-3"]}])
def test_roles_without_a_ps_have_none_whatever_job_mode_says(roles: dict[str, object]) -> None:
    """roles: naming no ps means no ps task (run, status); the async
    default of job.mode is `train`'s to refuse, in one line."""
    from infra.cluster.api import Cluster

    config = parse_config({"name": "x", "roles": roles}, source="c.yaml")
    assert config.roles.ps == [] and config.job.mode == "async"
    assert config.roles_of("pc-1") == ["chief"]
    cluster = Cluster(config)
    assert "ps" not in cluster.run_spec(["python", "x.py"]).program.task_types
    with pytest.raises(ConfigError, match=r"^c.yaml: roles: async mode needs a ps node; ") as info:
        cluster.train_spec()
    assert info.value.exit_code == 2
    assert cluster.train_spec(mode="sync").program.task_types == ("chief", "worker")
    # Left out, roles are the defaults, a ps on pc-1 included.
    assert parse_config({"name": "x"}, source="c.yaml").roles.ps == ["pc-1"]
    assert parse_config({"name": "x", "roles": None}, source="c.yaml").roles.ps == ["pc-1"]


def test_host_shorthand() -> None:
    config = parse_config(
        {
            "name": "x",
            "provider": "ssh",
            "nodes": ["a", "b"],
            "roles": {"ps": "a", "chief": "a", "worker": "b"},
            "hosts": {"a": "127.0.0.1:2201", "b": {"address": "10.0.0.2", "internal_address": "10.1.0.2"}},
        },
        source="c.yaml",
    )
    assert (config.hosts["a"].address, config.hosts["a"].port) == ("127.0.0.1", 2201)
    assert config.hosts["b"].internal_address == "10.1.0.2"


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes: [pc-1\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    # file:line:col of where the parser gave up (the flow list never closes
    # before the end of line 2; the stream ends at 3:1), then what it expected.
    assert str(info.value).startswith(f"{bad}:3:1: invalid YAML: expected ',' or ']'")
    bad.write_text("name: x\nnodes: [pc-1, {a: b]\n")  # a mismatched bracket mid-line
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert str(info.value) == f"{bad}:2:20: invalid YAML: expected ',' or '}}', but got ']'"


def test_relative_paths_resolve_from_the_file(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"name": "x", "setup": {"sync": ["data"]}}))
    config = load_config(tmp_path / "c.yaml")
    assert config.resolve("data") == (tmp_path / "data").resolve()
