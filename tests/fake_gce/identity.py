"""An instance's ``serviceAccounts`` as Compute Engine checks and stores it.

GCE takes at most one service account per instance: ``email`` is an
account's email or ``default`` (which GCE stores as the project's default
compute account, ``NUMBER-compute@developer.gserviceaccount.com``), and
``scopes`` are scope URLs (gcloud resolves its aliases, such as
``storage-rw``, before the request; the API never sees them). Anything
else is GCE's 400, naming the field, before the instance exists.
"""

from __future__ import annotations

import re
from typing import Any

from tests.fake_gce.catalog import Refusal as ApiError

_EMAIL = re.compile(r"^[a-z0-9][a-z0-9._+-]{0,99}@[a-z0-9-]+(\.[a-z0-9-]+)+$")
_SCOPE = re.compile(r"^https://www\.googleapis\.com/auth/[a-z0-9][a-z0-9._-]*$")


def project_number(project: str) -> str:
    """The fake's project number (the id projects.get gives)."""
    return str(10**18 + len(project))


def default_account(project: str) -> str:
    return f"{project_number(project)}-compute@developer.gserviceaccount.com"


def service_accounts(project: str, given: Any) -> list[dict[str, Any]]:
    """The stored ``serviceAccounts`` of an insert body's; ApiError 400
    for what GCE refuses."""
    if given is None:
        return []
    if not isinstance(given, list):
        raise ApiError(400, "Invalid value for field 'resource.serviceAccounts'", "invalid")
    if len(given) > 1:
        raise ApiError(
            400,
            "Invalid value for field 'resource.serviceAccounts': at most one service account "
            "may be specified",
            "invalid",
        )
    out = []
    for i, account in enumerate(given):
        field = f"resource.serviceAccounts[{i}]"
        email = account.get("email") if isinstance(account, dict) else None
        if not isinstance(email, str) or not (email == "default" or _EMAIL.match(email)):
            raise ApiError(
                400,
                f"Invalid value for field '{field}.email': '{email}'. "
                "The service account email is invalid.",
                "invalid",
            )
        scopes = account.get("scopes") or []
        for j, scope in enumerate(scopes):
            if not isinstance(scope, str) or not _SCOPE.match(scope):
                raise ApiError(
                    400,
                    f"Invalid value for field '{field}.scopes[{j}]': '{scope}'. "
                    "Invalid scope.",
                    "invalid",
                )
        out.append(
            {
                "email": default_account(project) if email == "default" else email,
                "scopes": list(scopes),
            }
        )
    return out
