"""Every section of cluster.yaml refuses a key it does not know, naming it
with the key it probably meant: a typo must never fall back to a default
silently (`job.stpes: 10` would train 600 steps; `gce.zonse` would
provision in the default zones)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from infra.config.loader import SshConfig, parse_config
from infra.errors import ConfigError
from infra.providers.gce.config import GceConfig

# cluster.yaml as read: a mapping of anything (the cases below replace "hosts").
SSH_HOSTS: dict[str, Any] = {
    "provider": "ssh",
    "hosts": {n: "10.0.0.1" for n in ["pc-1", "pc-2", "pc-3", "pc-4"]},
}


@pytest.mark.parametrize(
    ("data", "key", "meant"),
    [
        ({"job": {"stpes": 10}}, "job.stpes", "steps"),
        ({"job": {"arg": ["--x"]}}, "job.arg", "args"),
        ({"setup": {"pyhton": "python3.11"}}, "setup.pyhton", "python"),
        ({"ssh": {"usr": "me"}}, "ssh.usr", "user"),
        ({"ports": {"chef": 3000}}, "ports.chef", "chief"),
        ({"roles": {"workers": ["pc-2"]}}, "roles.workers", "worker"),
        ({"gce": {"zonse": ["us-central1-a"]}}, "gce.zonse", "zones"),
        ({"gce": {"accelerator": {"type": "nvidia-l4", "cuont": 1}}}, "gce.accelerator.cuont", "count"),
        ({**SSH_HOSTS, "hosts": {**SSH_HOSTS["hosts"], "pc-2": {"adress": "h"}}}, "hosts.pc-2.adress", "address"),
        ({"nmae": "y"}, "nmae", "name"),
    ],
)
def test_an_unknown_key_in_any_section_is_refused_with_a_suggestion(
    data: dict[str, Any], key: str, meant: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"name": "x", **data}, source="c.yaml")
    assert str(info.value).startswith(f"c.yaml: {key}: unknown key; did you mean '{meant}'?")
    assert info.value.exit_code == 2


def test_every_section_model_forbids_extra_keys() -> None:
    """A section added later cannot forget it either: each model reachable
    from a gce cluster's ClusterConfig (its own sections and the provider's,
    which config.py adds) forbids extra keys (the parametrized test above
    names today's sections one by one)."""
    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        assert model.model_config.get("extra") == "forbid", model.__name__
        for field in model.model_fields.values():
            for arg in _types(field.annotation):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    walk(arg)

    walk(type(parse_config({"name": "x", "provider": "gce"}, source="c.yaml")))
    assert {SshConfig, GceConfig} <= seen and len(seen) >= 9


def _types(annotation: Any) -> list[Any]:
    out = [annotation]
    for arg in getattr(annotation, "__args__", ()) or ():
        out += _types(arg)
    for meta in getattr(annotation, "__metadata__", ()) or ():
        out += _types(meta)
    origin = getattr(annotation, "__origin__", None)
    if origin is not None:
        out += _types(origin)
    return out


@pytest.mark.parametrize("section", ["ssh", "job", "setup", "gce"])
def test_a_section_with_every_key_commented_out_is_its_defaults(section: str) -> None:
    # `gce:` followed only by comments is YAML's null, not a mistake.
    config = parse_config(
        {"name": "x", "provider": "gce" if section == "gce" else "local", section: None},
        source="c.yaml",
    )
    assert getattr(config, section) == type(getattr(config, section))()
