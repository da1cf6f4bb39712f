"""The nodes' identity on Google Cloud: the service account their
metadata server hands tokens for, and the access scopes those tokens
carry (``gce.service_account``, ``gce.scopes``).

A program on a node that calls ``tf.io.gfile.glob("gs://...")`` or the
Cloud Storage client gets its credentials from the instance's metadata
server; an instance created with no service account has none, and the
first call fails. So every node gets one: by default the project's
default compute service account with read/write Cloud Storage only (the
least that results in a bucket need), ``cloud-platform`` when the user
asks for everything the account's roles allow.

Scopes are written as gcloud writes them (``storage-rw``,
``cloud-platform``; gcloud's ``--scopes`` aliases, resolved here as
gcloud resolves them, before the API sees them) or as full scope URLs.
Only pydantic-free tables and functions: the config section validates
with them, and the instance body is built from them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

AUTH = "https://www.googleapis.com/auth/"

# gcloud's aliases for `gcloud compute instances create --scopes`
# (googlecloudsdk/api_lib/compute/constants.py, SCOPES), each the scope
# URLs it stands for.
_DEFAULT = (
    "devstorage.read_only",
    "logging.write",
    "monitoring.write",
    "pubsub",
    "service.management.readonly",
    "servicecontrol",
    "trace.append",
)
SCOPE_ALIASES: dict[str, tuple[str, ...]] = {
    "bigquery": ("bigquery",),
    "cloud-platform": ("cloud-platform",),
    "cloud-source-repos": ("source.full_control",),
    "cloud-source-repos-ro": ("source.read_only",),
    "compute-ro": ("compute.readonly",),
    "compute-rw": ("compute",),
    "datastore": ("datastore",),
    "default": _DEFAULT,
    "logging-write": ("logging.write",),
    "monitoring": ("monitoring",),
    "monitoring-read": ("monitoring.read",),
    "monitoring-write": ("monitoring.write",),
    "pubsub": ("pubsub",),
    "service-control": ("servicecontrol",),
    "service-management": ("service.management.readonly",),
    "sql-admin": ("sqlservice.admin",),
    "storage-full": ("devstorage.full_control",),
    "storage-ro": ("devstorage.read_only",),
    "storage-rw": ("devstorage.read_write",),
    "taskqueue": ("taskqueue",),
    "trace": ("trace.append",),
    "userinfo-email": ("userinfo.email",),
}
DEFAULT_SCOPES = ("storage-rw",)
# Scopes under which a token may write objects to a bucket.
STORAGE_WRITE = frozenset(
    AUTH + s for s in ("devstorage.read_write", "devstorage.full_control", "cloud-platform")
)

# A service account's email (NAME@PROJECT.iam.gserviceaccount.com, or the
# default compute account NUMBER-compute@developer.gserviceaccount.com).
_EMAIL = re.compile(r"^[a-z0-9][a-z0-9._+-]{0,99}@[a-z0-9-]+(\.[a-z0-9-]+)+\Z")
_SCOPE_URL = re.compile(r"^https://www\.googleapis\.com/auth/[a-z0-9][a-z0-9._-]{0,99}\Z")


def service_account_problem(value: str) -> str | None:
    """Why ``value`` cannot be gce.service_account; None if it can."""
    if value == "default" or _EMAIL.match(value):
        return None
    return (
        f"{value[:60]!r} is not a service account: give default (the project's default "
        "compute account) or an email such as trainer@PROJECT.iam.gserviceaccount.com"
    )


def scope_urls(scopes: Sequence[str]) -> list[str]:
    """The scope URLs of gce.scopes (aliases resolved as gcloud does),
    sorted, each once. ValueError naming the first unknown one."""
    urls: set[str] = set()
    for scope in scopes:
        if _SCOPE_URL.match(scope):
            urls.add(scope)
        elif scope in SCOPE_ALIASES:
            urls.update(AUTH + s for s in SCOPE_ALIASES[scope])
        else:
            close = difflib.get_close_matches(scope[:60], list(SCOPE_ALIASES), n=1, cutoff=0.6)
            raise ValueError(
                f"{scope[:60]!r} is not a scope: give one of gcloud's aliases "
                f"({', '.join(sorted(SCOPE_ALIASES))}) or a scope URL ({AUTH}...)"
                + (f"; did you mean {close[0]!r}?" if close else "")
            )
    return sorted(urls)


def can_write_storage(scopes: Sequence[str]) -> bool:
    """Whether tokens with these scopes may write a bucket's objects."""
    return bool(STORAGE_WRITE & set(scope_urls(scopes)))


def short_scopes(urls: Sequence[str]) -> list[str]:
    """Scope URLs as gcloud's aliases where one alias stands for exactly
    that URL (``up --dry-run``, ``status``): shorter to read."""
    names = {AUTH + v[0]: k for k, v in SCOPE_ALIASES.items() if len(v) == 1}
    return [names.get(u, u.removeprefix(AUTH)) for u in urls]
