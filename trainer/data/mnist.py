"""MNIST from the official IDX gz files: find, download, verify, read.

Where the files come from, in order: ``--data-dir``; ``$MNIST_DIR``; else a
cache (``$TFCLUSTER_CACHE/mnist`` or ``~/.cache/tfcluster/mnist``) filled
once from a public mirror, every file checked against the official SHA-256
sums before it is kept. A folder given by the user is checked against its own
``SHA256SUMS`` when it has one (the offline copy in CI does) and always
against the IDX headers, so a truncated or corrupted file is a one-line
``DataError``, never a cryptic TensorFlow failure mid-training.

Two readers of the same files: ``load_split`` (numpy, for evaluation on the
chief) and ``read_split_tf`` (TensorFlow ops, used inside input pipelines so
that in async mode each worker reads its own local copy instead of receiving
the arrays from the chief inside the dataset graph).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trainer.errors import DataError

if TYPE_CHECKING:
    import tensorflow as tf

SPLITS = ("train", "test")
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
ALL_FILES = tuple(name for split in SPLITS for name in FILES[split])

# The official files' SHA-256 sums (as in TensorFlow Datasets' mnist
# checksums for the storage.googleapis.com/cvdf-datasets/mnist mirror), in
# sha256sum's format.
OFFICIAL_SUMS = """\
440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609  train-images-idx3-ubyte.gz
3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c  train-labels-idx1-ubyte.gz
8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6  t10k-images-idx3-ubyte.gz
f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6  t10k-labels-idx1-ubyte.gz
"""
MIRROR = "https://storage.googleapis.com/cvdf-datasets/mnist/"
SUMS_FILE = "SHA256SUMS"

IMAGE_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions
LABEL_MAGIC = 0x00000801  # unsigned bytes, 1 dimension
IMAGE_HEADER = 16
LABEL_HEADER = 8
SIDE = 28


@dataclass(frozen=True)
class Split:
    """One split in memory: uint8 images [N, 28, 28] and labels [N]."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


def cache_dir() -> Path:
    base = os.environ.get("TFCLUSTER_CACHE") or os.path.join("~", ".cache", "tfcluster")
    return Path(base).expanduser() / "mnist"


def resolve_data_dir(flag: str | None) -> Path:
    """The verified MNIST folder this process reads (downloading if needed)."""
    given = flag or os.environ.get("MNIST_DIR")
    if given:
        folder = Path(given).expanduser().resolve()
        missing = [n for n in ALL_FILES if not (folder / n).is_file()]
        if missing:
            raise DataError(f"no MNIST in {folder}: missing {', '.join(missing)}")
        sums = folder / SUMS_FILE
        if sums.is_file():
            verify_checksums(folder, parse_sums(sums.read_text()))
        return folder
    folder = cache_dir()
    missing = [n for n in ALL_FILES if not (folder / n).is_file()]
    if missing:
        download(folder, missing)
    verify_checksums(folder, {n: OFFICIAL_SHA256[n] for n in ALL_FILES})
    return folder.resolve()


def parse_sums(text: str) -> dict[str, str]:
    """``sha256sum`` output: ``<hex>  <name>`` per line."""
    sums: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            sums[parts[1].lstrip("*")] = parts[0].lower()
    return sums


OFFICIAL_SHA256 = parse_sums(OFFICIAL_SUMS)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checksums(folder: Path, expected: Mapping[str, str]) -> None:
    for name in ALL_FILES:
        want = expected.get(name)
        if want is None:
            continue
        got = sha256_of(folder / name)
        if got != want:
            raise DataError(
                f"{folder / name} is corrupted: SHA-256 {got[:16]}... expected {want[:16]}...; "
                "delete it to download it again"
            )


def download(
    folder: Path,
    names: tuple[str, ...] | list[str] = ALL_FILES,
    *,
    base_url: str | None = None,
    checksums: Mapping[str, str] = OFFICIAL_SHA256,
    timeout: float = 60.0,
) -> None:
    """Fetch ``names`` from the mirror into ``folder``; a file is only
    renamed into place once its SHA-256 matches, so a cut connection or a
    tampered mirror never leaves a bad file behind."""
    base = base_url or os.environ.get("TFCLUSTER_MNIST_MIRROR") or MIRROR
    if not base.endswith("/"):
        base += "/"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        url = base + name
        print(f"trainer: downloading {url}", flush=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
        tmp = Path(tmp_name)
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as r:
                while block := r.read(1 << 20):
                    digest.update(block)
                    out.write(block)
            got = digest.hexdigest()
            if got != checksums[name]:
                raise DataError(
                    f"downloaded {url} is corrupted: SHA-256 {got[:16]}... expected "
                    f"{checksums[name][:16]}..."
                )
            os.replace(tmp, folder / name)
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", None) or e
            raise DataError(
                f"cannot download {url} ({reason}); offline? set --data-dir or MNIST_DIR to a "
                "folder of the official MNIST files"
            ) from None
        finally:
            tmp.unlink(missing_ok=True)


def _read_idx(path: Path, magic: int, header: int) -> tuple[bytes, int]:
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"{path} is not a readable gzip file: {e}") from None
    if len(raw) < header or int.from_bytes(raw[:4], "big") != magic:
        raise DataError(f"{path} is not an MNIST IDX file (bad magic number)")
    count = int.from_bytes(raw[4:8], "big")
    return raw, count


def load_split(folder: Path, split: str) -> Split:
    """Read one split with numpy, checking the IDX headers against the sizes."""
    image_file, label_file = (folder / n for n in FILES[split])
    raw, count = _read_idx(image_file, IMAGE_MAGIC, IMAGE_HEADER)
    rows, cols = int.from_bytes(raw[8:12], "big"), int.from_bytes(raw[12:16], "big")
    if (rows, cols) != (SIDE, SIDE) or len(raw) != IMAGE_HEADER + count * SIDE * SIDE:
        raise DataError(f"{image_file} is truncated or not 28x28 images")
    images = np.frombuffer(raw, np.uint8, offset=IMAGE_HEADER).reshape(count, SIDE, SIDE)
    raw, label_count = _read_idx(label_file, LABEL_MAGIC, LABEL_HEADER)
    if label_count != count or len(raw) != LABEL_HEADER + count:
        raise DataError(f"{label_file} does not hold one label per image of {image_file}")
    labels = np.frombuffer(raw, np.uint8, offset=LABEL_HEADER)
    return Split(images=images, labels=labels)


def count_examples(folder: Path, split: str) -> int:
    """Images in a split, from the label file's header alone."""
    _, count = _read_idx(folder / FILES[split][1], LABEL_MAGIC, LABEL_HEADER)
    return count


def read_split_tf(folder: str, split: str) -> tuple[tf.Tensor, tf.Tensor]:
    """The same split as TensorFlow tensors (uint8 images [N, 28, 28], int32
    labels), read by ops that run wherever the calling function is placed:
    on an async worker, from that worker's own disk."""
    import tensorflow as tf

    def read(name: str, header: int) -> tf.Tensor:
        raw = tf.io.decode_compressed(tf.io.read_file(f"{folder}/{name}"), "GZIP")
        return tf.io.decode_raw(tf.strings.substr(raw, header, -1), tf.uint8)

    image_file, label_file = FILES[split]
    images = tf.reshape(read(image_file, IMAGE_HEADER), [-1, SIDE, SIDE])
    labels = tf.cast(read(label_file, LABEL_HEADER), tf.int32)
    return images, labels
