"""Pytest fixtures around the fake Compute Engine API.

Use them with ``pytest_plugins = ["tests.fake_gce.fixtures"]`` (the root
conftest, or a test module):

* ``fake_gce``            a started ``FakeGce`` with tiny latencies, stopped
                          after the test; the test fails if an operation
                          thread hit an unexpected error.
* ``fast_gce``            the GCE provider's retry backoff and polling made
                          quick (milliseconds), for the duration of the test.
* ``gce_config``          ``gce_config(**overrides) -> ClusterConfig`` for
                          provider gce pointed at ``fake_gce`` (anonymous
                          credentials, zones us-central1-a and -b).
* ``gce_cluster_yaml``    ``gce_cluster_yaml(**overrides) -> Path`` of a
                          cluster.yaml with the same settings, for the CLI.

Overrides are nested dicts merged into the cluster.yaml mapping, for
example ``gce_config(gce={"zones": ["us-central1-f"]}, nodes=["pc-1"])``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.loader import ClusterConfig, parse_config
from tests.fake_gce import FakeGce, Latency

# Small but non-zero: states are observable and operations really overlap.
FAST = Latency(
    provision=0.05, staging=0.02, start=0.03, stop=0.03, delete=0.03, firewall=0.01
)


@pytest.fixture
def fake_gce() -> Iterator[FakeGce]:
    fake = FakeGce(latency=copy.deepcopy(FAST), wait_max_s=0.5)
    with fake:
        yield fake
    assert not fake.internal_errors, f"fake GCE operation threads failed: {fake.internal_errors}"


@pytest.fixture
def fast_gce(monkeypatch: pytest.MonkeyPatch) -> None:
    from infra.providers import gce

    monkeypatch.setattr(
        gce.GceProvider,
        "retry_policy",
        gce.RetryPolicy(attempts=5, initial_s=0.01, max_delay_s=0.05, deadline_s=10.0),
    )
    monkeypatch.setattr(gce.GceProvider, "poll_interval_s", 0.02)


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def gce_mapping(endpoint: str, **overrides: Any) -> dict[str, Any]:
    """The cluster.yaml mapping of a 4-node gce cluster on the fake."""
    base: dict[str, Any] = {
        "name": "tfc-test",
        "provider": "gce",
        "nodes": ["pc-1", "pc-2", "pc-3", "pc-4"],
        "roles": {"ps": "pc-1", "chief": "pc-1", "worker": ["pc-2", "pc-3", "pc-4"]},
        "gce": {
            "project": "fake-project",
            "zones": ["us-central1-a", "us-central1-b"],
            "api_endpoint": endpoint,
            "credentials": "anonymous",
            "operation_timeout": 20,
            "ssh_source_ranges": ["198.51.100.7/32"],
        },
    }
    return _merge(base, overrides)


@pytest.fixture
def gce_config(fake_gce: FakeGce, fast_gce: None) -> Callable[..., ClusterConfig]:
    def make(**overrides: Any) -> ClusterConfig:
        return parse_config(gce_mapping(fake_gce.endpoint, **overrides), source="<test>")

    return make


@pytest.fixture
def gce_cluster_yaml(
    fake_gce: FakeGce, fast_gce: None, tmp_path: Path
) -> Callable[..., Path]:
    def make(**overrides: Any) -> Path:
        path = tmp_path / "cluster.yaml"
        path.write_text(yaml.safe_dump(gce_mapping(fake_gce.endpoint, **overrides)))
        return path

    return make
