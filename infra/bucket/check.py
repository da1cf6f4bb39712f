"""What ``up`` checks of the cluster's bucket before it creates anything.

The bucket must exist, and whoever writes the runs into it must be allowed
to: the nodes write with their own identity (on GCE the service account
``up`` gives them; elsewhere ``storage.credentials``, the very credentials
this machine checks with). A missing bucket or a missing permission is
one line, exit 2, naming the bucket, the account and the role to grant:
``roles/storage.objectAdmin`` on that bucket holds every permission a run
needs (create, get, list, delete objects).

For an account other than this machine's (a GCE node's service account),
permissions cannot be tested from here: the bucket's IAM policy is read
instead, and the account must be named in a binding of a role that
writes objects (a grant at the project level is not visible there; the
message says how to grant it on the bucket, which is harmless on top).
"""

from __future__ import annotations

import logging
from pathlib import Path

from infra.bucket.client import errors, open_client
from infra.config.storage import NodeIdentity, StorageConfig
from infra.errors import ConfigError
from infra.storage import transfer
from infra.storage._gcs import api_exceptions

log = logging.getLogger("tfcluster")

ROLE = "roles/storage.objectAdmin"
NEEDED = (
    "storage.objects.create",
    "storage.objects.delete",
    "storage.objects.get",
    "storage.objects.list",
)
# Roles that hold all of NEEDED on a bucket.
WRITER_ROLES = frozenset(
    {ROLE, "roles/storage.admin", "roles/storage.objectUser", "roles/storage.legacyBucketOwner"}
)


def _grant(bucket: str, member: str) -> str:
    return (
        f"gcloud storage buckets add-iam-policy-binding gs://{bucket} "
        f"--member={member} --role={ROLE}"
    )


def check_bucket(storage: StorageConfig, base: Path, node: NodeIdentity | None = None) -> None:
    """ConfigError (exit 2) unless the bucket exists and the nodes' writer
    may write it."""
    url = storage.url
    client = open_client(storage, base)
    what = f"storage.bucket: {url}"
    with errors(what):
        try:
            held = set(client.bucket(url.bucket).test_iam_permissions(list(NEEDED)))
        except api_exceptions.NotFound:
            raise ConfigError(
                f"{what}: bucket {url.bucket} does not exist",
                hint=f"create it with `gcloud storage buckets create gs://{url.bucket}`, "
                "or fix storage.bucket",
            ) from None
        if node is None:
            missing = [p for p in NEEDED if p not in held]
            if missing:
                account = transfer.account_of(client, storage.credentials)
                member = f"serviceAccount:{account}" if "@" in account else "user:YOU@EXAMPLE.COM"
                raise ConfigError(
                    f"{what}: {account} may not write runs there (lacks "
                    f"{', '.join(missing)}): it needs {ROLE} on that bucket",
                    hint=_grant(url.bucket, member),
                )
            return
        try:
            policy = client.bucket(url.bucket).get_iam_policy()
        except api_exceptions.Forbidden:
            log.warning(
                "%s: cannot read its IAM policy to check that %s may write there; "
                "uploads will say so if it may not",
                url,
                node.email,
            )
            return
    members = {f"serviceAccount:{node.email}", "allUsers", "allAuthenticatedUsers"}
    if node.default_account and node.project:
        # GCE's default account is an editor of its project, and a
        # bucket's default policy lets the project's editors own it.
        members |= {f"projectEditor:{node.project}", f"projectOwner:{node.project}"}
    for binding in policy.bindings:
        if binding.get("role") in WRITER_ROLES and members & set(binding.get("members", ())):
            return
    raise ConfigError(
        f"{what}: the nodes' service account {node.email} may not write runs there: "
        f"it needs {ROLE} on that bucket",
        hint=_grant(url.bucket, f"serviceAccount:{node.email}"),
    )
