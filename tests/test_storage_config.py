"""cluster.yaml's storage section and the gs:// names it accepts: bucket
names GCS would refuse, URLs with '..' or empty names, run ids with '/',
object names that leave a run folder; each one line."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config.loader import parse_config
from infra.errors import ConfigError
from infra.storage.urls import GsUrl, relative_name, run_id_problem


def _config(storage: Any) -> Any:
    return parse_config({"name": "c1", "storage": storage}, source="cluster.yaml")


def test_a_bucket_with_a_prefix() -> None:
    config = _config({"bucket": "gs://my-runs/team/a", "credentials": "anonymous"})
    assert config.storage.url == GsUrl("my-runs", "team/a")
    assert str(config.storage.run_url("c1", "cnn-async-1")) == "gs://my-runs/team/a/c1/cnn-async-1"
    assert _config({"bucket": "gs://my-runs/"}).storage.url == GsUrl("my-runs", "")


@pytest.mark.parametrize(
    ("bucket", "words"),
    [
        ("my-runs", "is not a gs:// URL"),
        ("gs://", "names no bucket"),
        ("gs://My_Runs", "is not a bucket name"),
        ("gs://ab", "is not a bucket name"),
        ("gs://-runs", "is not a bucket name"),
        ("gs://google-runs", "'google'"),
        ("gs://goog-runs", "'goog'"),
        ("gs://192.168.1.1", "IP address"),
        ("gs://" + "a" * 64, "is not a bucket name"),
        ("gs://runs/a/../b", "'..'"),
        ("gs://runs/a//b", "empty name"),
        ("gs://runs/a//", "empty name"),
        ("gs://runs/a\nb", "control characters"),
    ],
)
def test_names_gcs_would_refuse_are_one_line(bucket: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _config({"bucket": bucket})
    line = str(caught.value)
    assert "\n" not in line and line.startswith("cluster.yaml: storage.bucket:")
    assert words in line


def test_unknown_keys_and_endpoints() -> None:
    with pytest.raises(ConfigError, match="did you mean 'bucket'"):
        _config({"buckt": "gs://my-runs"})
    with pytest.raises(ConfigError, match="is not a URL"):
        _config({"bucket": "gs://my-runs", "endpoint": "localhost:9"})


def test_the_emulator_variable_is_the_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    storage = _config({"bucket": "gs://my-runs"}).storage
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    assert storage.api_endpoint() is None
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:9023")
    assert storage.api_endpoint() == "http://127.0.0.1:9023"
    given = _config({"bucket": "gs://my-runs", "endpoint": "http://h:1/"}).storage
    assert given.api_endpoint() == "http://h:1"


def test_run_ids_and_object_names_that_climb_out() -> None:
    assert run_id_problem("cnn-async-20261125-061542") is None
    for bad in ("a/b", "..", "../x", "", "A"):
        assert run_id_problem(bad) is not None
    prefix = "p/c/run/"
    assert relative_name("p/c/run/checkpoints/ckpt-1.index", prefix) == "checkpoints/ckpt-1.index"
    for bad in ("p/c/run/../x", "p/c/run//etc/passwd", "p/c/run/a/./b", "p/c/other/x",
                "p/c/run/", "p/c/run/a\\..\\b", "p/c/run/a\rb"):  # fmt: skip
        assert relative_name(bad, prefix) is None, bad

