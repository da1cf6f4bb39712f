"""The fake Cloud Storage JSON API, driven by the real google-cloud-storage
client: the uploads it makes (media, multipart, resumable), downloads with
ranges, listing with prefix, delimiter and pages, delete, ifGenerationMatch,
and the faults it injects (a 503 mid-upload is survived by the client)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud.storage import client as storage

from infra.storage import transfer
from tests.fake_gcs.server import FakeGcs

KIB = 1024


@pytest.fixture
def fake() -> Iterator[FakeGcs]:
    with FakeGcs() as server:
        server.create_bucket("runs-bucket")
        yield server


@pytest.fixture
def client(fake: FakeGcs) -> storage.Client:
    return storage.Client(
        project="p", credentials=AnonymousCredentials(),
        client_options={"api_endpoint": fake.endpoint},
    )  # fmt: skip


def _uploads(fake: FakeGcs) -> list[str]:
    return [
        "chunk" if c.method == "PUT" else c.query.get("uploadType", "?")
        for c in fake.calls
        if c.path.startswith("/upload")
    ]


def test_small_files_go_multipart_and_come_back_whole(fake: FakeGcs, client: storage.Client) -> None:
    blob = client.bucket("runs-bucket").blob("a/b.json")
    blob.upload_from_string(b'{"x": 1}', content_type="application/json")
    assert _uploads(fake) == ["multipart"]
    assert fake.read("runs-bucket", "a/b.json") == b'{"x": 1}'
    got = client.bucket("runs-bucket").blob("a/b.json").download_as_bytes()
    assert got == b'{"x": 1}'


def test_media_upload(fake: FakeGcs, client: storage.Client) -> None:
    # What a resumable session is not: a plain media upload, through the
    # client's own media class against the fake's endpoint.
    from google.cloud.storage._media.requests import SimpleUpload

    url = f"{fake.endpoint}/upload/storage/v1/b/runs-bucket/o?uploadType=media&name=m.bin"
    SimpleUpload(url).transmit(client._http, b"media bytes", "application/octet-stream")
    assert _uploads(fake) == ["media"]
    assert fake.read("runs-bucket", "m.bin") == b"media bytes"


def test_large_files_go_resumable_and_survive_a_503_mid_upload(
    fake: FakeGcs, client: storage.Client, tmp_path: Path
) -> None:
    data = os.urandom(9 * 1024 * KIB)  # above the client's 8 MiB multipart limit
    source = tmp_path / "ckpt.data"
    source.write_bytes(data)
    fake.fail(503, upload="chunk", after=2)  # the third chunk, once
    size = transfer.upload_file(
        client.bucket("runs-bucket"), "run/ckpt.data", source, chunk_bytes=1024 * KIB
    )
    assert size == len(data)
    assert fake.failures_left() == 0
    assert fake.read("runs-bucket", "run/ckpt.data") == data
    kinds = _uploads(fake)
    assert kinds[0] == "resumable" and kinds.count("chunk") == 9 + 1  # the failed one, again
    assert [c.status for c in fake.calls if c.status in (503,)] == [503]


def test_a_failure_that_never_ends_is_raised_after_the_attempts(
    fake: FakeGcs, client: storage.Client, tmp_path: Path
) -> None:
    source = tmp_path / "f"
    source.write_bytes(b"x" * 10)
    fake.fail(403, times=1000)
    with pytest.raises(exceptions.Forbidden):
        transfer.upload_file(client.bucket("runs-bucket"), "f", source, sleep=lambda s: None)
    assert fake.names("runs-bucket") == []


def test_ranged_and_resumed_downloads(fake: FakeGcs, client: storage.Client) -> None:
    data = bytes(range(256)) * 1000
    fake.put("runs-bucket", "big", data)
    blob = client.bucket("runs-bucket").blob("big")
    assert blob.download_as_bytes(start=10, end=19) == data[10:20]
    # The media GET's answer (the client may also read the bucket's metadata,
    # before or after it: not the last call, the download's).
    assert [c.status for c in fake.calls if c.query.get("alt") == "media"] == [206]
    # A connection cut mid-body: the client asks for the rest with a Range.
    fake.cut_download(after=50_000)
    out = io.BytesIO()
    client.bucket("runs-bucket").blob("big").download_to_file(out)
    assert out.getvalue() == data
    assert [c.status for c in fake.calls][-2:] == [200, 206]  # cut, then the rest


def test_listing_with_prefix_delimiter_and_pages(fake: FakeGcs, client: storage.Client) -> None:
    for name in ["p/c/r1/a", "p/c/r1/b/c", "p/c/r2/x", "p/other", "q/z"]:
        fake.put("runs-bucket", name, b"1")
    names = [b.name for b in client.list_blobs("runs-bucket", prefix="p/c/", max_results=None,
                                                page_size=1)]  # fmt: skip
    assert names == ["p/c/r1/a", "p/c/r1/b/c", "p/c/r2/x"]
    assert sum(1 for c in fake.calls if c.path.endswith("/o")) >= 3  # one per page
    assert list(transfer.subfolders(client, transfer.GsUrl("runs-bucket", "p/c"))) == ["r1", "r2"]


def test_delete_and_if_generation_match(fake: FakeGcs, client: storage.Client) -> None:
    bucket = client.bucket("runs-bucket")
    bucket.blob("k").upload_from_string(b"1", if_generation_match=0)  # must not exist
    with pytest.raises(exceptions.PreconditionFailed):
        bucket.blob("k").upload_from_string(b"2", if_generation_match=0)
    generation = bucket.get_blob("k").generation
    with pytest.raises(exceptions.PreconditionFailed):
        bucket.blob("k").delete(if_generation_match=generation + 1)
    bucket.blob("k").delete(if_generation_match=generation)
    assert fake.names("runs-bucket") == []
    with pytest.raises(exceptions.NotFound):
        bucket.blob("k").delete()


def test_missing_bucket_and_permissions(fake: FakeGcs, client: storage.Client) -> None:
    with pytest.raises(exceptions.NotFound):
        client.bucket("no-such").test_iam_permissions(["storage.objects.create"])
    fake.create_bucket("read-only", permissions={"storage.objects.get", "storage.objects.list"})
    held = client.bucket("read-only").test_iam_permissions(
        ["storage.objects.create", "storage.objects.get"]
    )
    assert held == ["storage.objects.get"]
    with pytest.raises(exceptions.Forbidden):
        client.bucket("read-only").blob("x").upload_from_string(b"1")
