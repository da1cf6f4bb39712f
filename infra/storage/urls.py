"""``gs://`` URLs and the names Cloud Storage accepts, checked here before
any request: a bucket name GCS would refuse, a URL with ``..`` or an empty
name, a run id that could climb out of its folder, an object name that
leaves the run folder it is fetched from. Each is refused with one line
(``ValueError``; callers turn it into their error). Standard library only:
the nodes import it too.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

# GCS's bucket naming rules (cloud.google.com/storage/docs/buckets#naming):
# 3-63 characters (222 with dots, each dot-separated part at most 63),
# lowercase letters, digits, '-', '_' and '.', starting and ending with a
# letter or digit; not an IP address; not starting with "goog", and no
# "google" in it.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]\Z")
# A run id as infra/spec/job.py makes it (one folder name).
_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,80}\Z")
# An object name part: printable, no control characters (GCS refuses
# carriage returns and line feeds in names).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def bucket_problem(name: str) -> str | None:
    """Why GCS would refuse ``name`` as a bucket name; None if it accepts it."""
    shown = repr(name[:70])
    if not _BUCKET.match(name):
        return (
            f"{shown} is not a bucket name: 3-63 lowercase letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    parts = name.split(".")
    if ("." not in name and len(name) > 63) or any(not p or len(p) > 63 for p in parts):
        return f"{shown} is not a bucket name: at most 63 characters between dots"
    if name.startswith("goog") or "google" in name or "g00gle" in name:
        return f"{shown} is not a bucket name: GCS refuses names with 'goog' first or 'google'"
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return None
    return f"{shown} is not a bucket name: GCS refuses an IP address"


def path_problem(path: str) -> str | None:
    """Why ``path`` (the part after the bucket) cannot name a folder of
    runs; None if it can."""
    if _CONTROL.search(path):
        return "an object name has no control characters"
    parts = path.split("/")
    if any(p in (".", "..") for p in parts):
        return "'.' and '..' are not folders in a bucket"
    if any(not p for p in parts):  # 'a//b', '/a', and 'a//' (one '/' at the end is cut)
        return "an empty name between slashes ('//') names nothing"
    if len(path.encode()) > 900:
        return "an object name is at most 1024 bytes, and runs need room under it"
    return None


@dataclass(frozen=True)
class GsUrl:
    """``gs://BUCKET/PATH``: a bucket and a folder in it ('' = its top)."""

    bucket: str
    path: str = ""

    def __str__(self) -> str:
        return f"gs://{self.bucket}/{self.path}" if self.path else f"gs://{self.bucket}"

    def child(self, *names: str) -> GsUrl:
        """The folder (or object) ``names`` below this one."""
        return GsUrl(self.bucket, "/".join(p for p in (self.path, *names) if p))

    @property
    def prefix(self) -> str:
        """The object-name prefix of everything in this folder ('a/b/')."""
        return f"{self.path}/" if self.path else ""


def parse_gs_url(text: str) -> GsUrl:
    """``gs://NAME[/path]`` as a GsUrl; ValueError (one line) for anything
    else: another scheme, a bucket name GCS refuses, ``..``, an empty name."""
    if not isinstance(text, str) or not text.startswith("gs://"):
        raise ValueError(f"{str(text)[:70]!r} is not a gs:// URL (gs://BUCKET/FOLDER)")
    bucket, _, path = text[len("gs://") :].partition("/")
    if not bucket:
        raise ValueError(f"{text[:70]!r} names no bucket: gs://BUCKET/FOLDER")
    if (problem := bucket_problem(bucket)) is not None:
        raise ValueError(problem)
    path = path[:-1] if path.endswith("/") else path
    if path and (problem := path_problem(path)) is not None:
        raise ValueError(f"{text[:70]!r}: {problem}")
    return GsUrl(bucket, path)


def run_id_problem(run_id: str) -> str | None:
    """Why ``run_id`` cannot name a run's folder; None if it can."""
    if _RUN_ID.match(run_id):
        return None
    return (
        f"{run_id[:60]!r} is not a run id (lowercase letters, digits and '-', "
        "as `deploy.py runs` lists them; no '/')"
    )


def relative_name(name: str, prefix: str) -> str | None:
    """The path of object ``name`` inside the folder ``prefix`` ('a/b/'),
    or None where it is not a plain path there: outside it, absolute,
    with '.', '..' or empty parts, a control character, a backslash.
    What a bucket holds is data: an object named ``run/../../x`` must
    never be written outside the folder it is fetched into."""
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix) :]
    if not rest or rest.startswith("/") or "\\" in rest or _CONTROL.search(rest):
        return None
    parts = rest.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    return rest
