"""The nodes' identity on GCE (gce.service_account, gce.scopes): in the
insert body, in `up --dry-run`, in `status --json`, refused by the fake
as real GCE refuses a bad body, and refused in cluster.yaml first."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner

from deploy import cli
from infra.providers.gce import identity
from tests.fake_gce.identity import default_account
from tests.fake_gce.server import FakeGce
from tests.fake_gcs.server import OBJECT_ADMIN, FakeGcs

pytest_plugins = ["tests.fake_gce.fixtures"]

MakeYaml = Callable[..., Path]
RW = "https://www.googleapis.com/auth/devstorage.read_write"
PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")


def run(config: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--config", str(config), *args], catch_exceptions=False)
    return result.exit_code, result.output


def test_every_node_gets_the_default_account_with_storage_read_write(
    fake_gce: FakeGce, gce_cluster_yaml: MakeYaml
) -> None:
    config = gce_cluster_yaml()
    code, out = run(config, "up", "--dry-run")
    assert code == 0, out
    assert "  identity service account default (scopes storage-rw)\n" in out
    code, out = run(config, "up", "--skip-setup")
    assert code == 0, out
    instances = fake_gce.instances()
    assert len(instances) == 4
    for inst in instances:
        assert inst["serviceAccounts"] == [
            {"email": default_account("fake-project"), "scopes": [RW]}
        ]
    code, out = run(config, "status", "--json")
    assert code == 0, out
    for node in json.loads(out):
        assert node["service_account"] == default_account("fake-project")
        assert node["scopes"] == [RW]


def test_an_account_of_ones_own_and_cloud_platform(
    fake_gce: FakeGce, gce_cluster_yaml: MakeYaml
) -> None:
    email = "trainer@fake-project.iam.gserviceaccount.com"
    config = gce_cluster_yaml(
        nodes=["pc-1", "pc-2"],
        roles={"ps": "pc-1", "chief": "pc-1", "worker": "pc-2"},
        gce={"service_account": email, "scopes": ["cloud-platform"]},
    )
    code, out = run(config, "up", "--dry-run")
    assert code == 0, out
    assert f"  identity service account {email} (scopes cloud-platform)\n" in out
    code, out = run(config, "up", "--skip-setup")
    assert code == 0, out
    assert [i["serviceAccounts"] for i in fake_gce.instances()] == [
        [{"email": email, "scopes": [PLATFORM]}]
    ] * 2


@pytest.mark.parametrize(
    ("gce", "words"),
    [
        ({"service_account": "trainer"}, "gce.service_account: 'trainer' is not a service account"),
        ({"scopes": ["storage-rx"]}, "did you mean 'storage-rw'?"),
        ({"scopes": []}, "list at least one scope"),
    ],
)
def test_cluster_yaml_refuses_what_gce_would(
    gce_cluster_yaml: MakeYaml, gce: dict[str, Any], words: str
) -> None:
    code, out = run(gce_cluster_yaml(gce=gce), "up", "--dry-run")
    assert code == 2, out
    assert words in out


def _insert(fake: FakeGce, accounts: Any) -> requests.Response:
    body = {
        "name": "pc-9",
        "machineType": "zones/us-central1-a/machineTypes/e2-standard-2",
        "disks": [{"boot": True, "initializeParams": {
            "sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
        "networkInterfaces": [{"network": "global/networks/default"}],
        "serviceAccounts": accounts,
    }  # fmt: skip
    return requests.post(
        f"{fake.endpoint}/compute/v1/projects/fake-project/zones/us-central1-a/instances",
        json=body,
        timeout=10,
    )


@pytest.mark.parametrize(
    ("accounts", "field"),
    [
        ([{"email": "not an email", "scopes": [RW]}], "serviceAccounts[0].email"),
        ([{"email": "default", "scopes": ["storage-rw"]}], "serviceAccounts[0].scopes[0]"),
        ([{"email": "default", "scopes": [RW]}] * 2, "serviceAccounts"),
    ],
)
def test_the_fake_refuses_a_body_real_gce_refuses(
    fake_gce: FakeGce, accounts: Any, field: str
) -> None:
    answer = _insert(fake_gce, accounts)
    assert answer.status_code == 400, answer.text
    assert f"'resource.{field}" in answer.json()["error"]["message"]
    assert fake_gce.instances() == []


def test_aliases_resolve_as_gclouds() -> None:
    assert identity.scope_urls(["storage-rw", "cloud-platform", RW]) == [PLATFORM, RW]
    assert len(identity.scope_urls(["default"])) == 7
    assert identity.can_write_storage(["storage-rw"])
    assert identity.can_write_storage(["cloud-platform"])
    assert not identity.can_write_storage(["storage-ro", "default"])


# -- the bucket's writer is the nodes' service account ------------------------------------


@pytest.fixture
def fake_gcs() -> Iterator[FakeGcs]:
    with FakeGcs() as server:
        yield server


def _bucket(fake_gcs: FakeGcs, bindings: list[dict[str, Any]]) -> None:
    bucket = fake_gcs.create_bucket(
        "tfc-runs", permissions=OBJECT_ADMIN | {"storage.buckets.getIamPolicy"}
    )
    bucket.bindings = bindings


def _storage(fake_gcs: FakeGcs) -> dict[str, Any]:
    return {"bucket": "gs://tfc-runs/t", "endpoint": fake_gcs.endpoint, "credentials": "anonymous"}


def test_up_refuses_a_bucket_the_nodes_account_may_not_write(
    fake_gce: FakeGce, fake_gcs: FakeGcs, gce_cluster_yaml: MakeYaml
) -> None:
    email = "trainer@fake-project.iam.gserviceaccount.com"
    _bucket(fake_gcs, [{"role": "roles/storage.objectViewer", "members": [f"serviceAccount:{email}"]}])
    config = gce_cluster_yaml(gce={"service_account": email}, storage=_storage(fake_gcs))
    code, out = run(config, "up", "--skip-setup")
    assert code == 2, out
    assert f"the nodes' service account {email} may not write runs there" in out
    assert "roles/storage.objectAdmin on that bucket" in out
    assert fake_gce.instances() == [] and fake_gce.firewalls() == []


def test_the_default_account_writes_as_an_editor_of_the_project(
    fake_gce: FakeGce, fake_gcs: FakeGcs, gce_cluster_yaml: MakeYaml
) -> None:
    # A bucket's default policy: the project's editors own it.
    _bucket(fake_gcs, [{"role": "roles/storage.legacyBucketOwner",
                        "members": ["projectEditor:fake-project", "projectOwner:fake-project"]}])  # fmt: skip
    config = gce_cluster_yaml(nodes=["pc-1"], roles={"ps": [], "chief": "pc-1", "worker": []},
                              job={"mode": "single"}, storage=_storage(fake_gcs))  # fmt: skip
    code, out = run(config, "up", "--skip-setup")
    assert code == 0, out
    code, out = run(config, "up", "--dry-run")
    assert "  bucket  gs://tfc-runs/t (checked before anything is created)" in out


def test_scopes_that_cannot_write_a_bucket_are_refused(
    fake_gce: FakeGce, fake_gcs: FakeGcs, gce_cluster_yaml: MakeYaml
) -> None:
    _bucket(fake_gcs, [])
    config = gce_cluster_yaml(gce={"scopes": ["storage-ro"]}, storage=_storage(fake_gcs))
    code, out = run(config, "up", "--skip-setup")
    assert code == 2, out
    assert "gce.scopes: storage-ro cannot write to the cluster's bucket" in out
    assert fake_gce.instances() == []
