"""One `deploy.py up` on gce, counted on the fake Compute API: the nodes
are listed to plan (once without the lock, once under it) and that listing
is passed down (prepare's key and label sync, the wait, the status table),
not listed again; cluster.yaml is checked against the project once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from deploy import cli
from infra.providers.gce import checks
from tests.fake_gce import FakeGce

pytest_plugins = ["tests.fake_gce.fixtures"]

LIST = "instances.aggregatedList"
# What checking cluster.yaml against the project reads (GceProject.check_plan).
CHECK_READS = ("images.getFromFamily", "networks.get", "projects.get")


@pytest.fixture
def static_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the runs of checks.check_config (the real one runs)."""
    runs: list[int] = []
    real = checks.check_config

    def counted(*args: Any, **kwargs: Any) -> None:
        runs.append(1)
        real(*args, **kwargs)

    monkeypatch.setattr(checks, "check_config", counted)
    return runs


def _up(config: Path) -> None:
    result = CliRunner().invoke(
        cli, ["--config", str(config), "up", "--skip-setup"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output


def _ops(fake: FakeGce) -> list[str]:
    return [c.op for c in fake.calls]


def test_an_up_with_nothing_to_do_lists_the_nodes_twice(
    fake_gce: FakeGce, gce_cluster_yaml: Callable[..., Path], static_checks: list[int]
) -> None:
    config = gce_cluster_yaml()
    _up(config)
    fake_gce.reset_calls()
    static_checks.clear()
    _up(config)
    ops = _ops(fake_gce)
    assert ops.count(LIST) <= 2, ops
    assert [ops.count(op) for op in CHECK_READS] == [1, 1, 1], ops
    assert len(static_checks) == 1
    assert not any(c.mutating for c in fake_gce.calls)  # and it still changes nothing


def test_an_up_that_creates_lists_twice_before_it_creates(
    fake_gce: FakeGce, gce_cluster_yaml: Callable[..., Path], static_checks: list[int]
) -> None:
    """The waits for the new nodes poll the listing; what comes before the
    first insert (both plans, prepare, create's look for nodes made
    meanwhile) reads two listings."""
    _up(gce_cluster_yaml())
    ops = _ops(fake_gce)
    assert ops[: ops.index("instances.insert")].count(LIST) <= 2, ops
    assert [ops.count(op) for op in CHECK_READS] == [1, 1, 1], ops
    assert len(static_checks) == 1
    assert {i["status"] for i in fake_gce.instances()} == {"RUNNING"}
