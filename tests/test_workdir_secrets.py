"""The working folder is synced to every node: the credentials the cluster
config names, tfcluster's own state (keys, pinned host keys) and private-key
folders are never part of it, however they are reached (a symlink too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.config.loader import load_config
from infra.setup.sync_items import secret_paths, workdir_item


def test_credentials_keys_and_state_are_never_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "project"
    (work / "keys").mkdir(parents=True)
    (work / "train.py").write_text("print('hi')\n")
    (work / "service-account.json").write_text('{"private_key": "SECRET"}')
    (work / "keys" / "id_ed25519").write_text("SECRET KEY")
    (work / "copy-of-sa.json").symlink_to(work / "service-account.json")
    (work / ".ssh").mkdir()
    (work / ".ssh" / "id_rsa").write_text("SECRET")
    state = work / "state"  # tfcluster's home inside the working folder
    (state / "clusters" / "x").mkdir(parents=True)
    (state / "clusters" / "x" / "id_ed25519").write_text("SECRET")
    monkeypatch.setenv("TFCLUSTER_HOME", str(state))
    config_file = work / "cluster.yaml"
    config_file.write_text(
        "name: x\nprovider: gce\n"
        "gce: {project: p, zones: [us-central1-a], credentials: service-account.json}\n"
        "ssh: {key_file: keys/id_ed25519}\n"
    )
    config = load_config(config_file)

    item = workdir_item(work, "tfcluster/work", secret_paths(config))
    sent = sorted(p.relative_to(work).as_posix() for p in item.files())
    assert sent == ["cluster.yaml", "train.py"]
    # Without the config's secrets only the generic rules apply: the
    # credentials would go, which is what this guards against.
    plain = sorted(p.relative_to(work).as_posix() for p in workdir_item(work, "w").files())
    assert "service-account.json" in plain and "keys/id_ed25519" in plain
    assert ".ssh/id_rsa" not in plain


def test_a_leftover_gce_section_still_keeps_its_key_out_on_another_provider(
    tmp_path: Path,
) -> None:
    # The file was switched to provider ssh, its gce section (and the key
    # file it names) left in place: the key is still a secret.
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    (work / "sa.json").write_text('{"private_key": "SECRET"}')
    config_file = work / "cluster.yaml"
    hosts = ", ".join(f"pc-{i}: 10.0.0.{i}" for i in range(1, 5))
    config_file.write_text(
        f"name: x\nprovider: ssh\nhosts: {{{hosts}}}\ngce: {{credentials: sa.json}}\n"
    )
    item = workdir_item(work, "tfcluster/work", secret_paths(load_config(config_file)))
    assert sorted(p.relative_to(work).as_posix() for p in item.files()) == [
        "cluster.yaml",
        "train.py",
    ]


def test_the_buckets_key_file_is_never_sent(tmp_path: Path) -> None:
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    (work / "bucket-writer.json").write_text('{"private_key": "SECRET"}')
    config_file = work / "cluster.yaml"
    config_file.write_text(
        "name: x\nstorage: {bucket: gs://my-runs, credentials: bucket-writer.json}\n"
    )
    item = workdir_item(work, "tfcluster/work", secret_paths(load_config(config_file)))
    assert sorted(p.relative_to(work).as_posix() for p in item.files()) == [
        "cluster.yaml",
        "train.py",
    ]
