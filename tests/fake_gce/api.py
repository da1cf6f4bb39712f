"""The words every resource of the fake GCE shares: a request as the fake saw
it (``Call``), an HTTP error answer and an operation's error in the real
API's shapes (``ApiError``, ``OpFailure``), and the small makers of GCE's
fields (timestamps, fingerprints, ids, URLs, one page of a list).

It owns no resource: each resource's module (instances, firewalls,
operations, projects) builds its answers from these.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

# selfLinks name Google's endpoint, as the real API's do, whatever the
# endpoint the client used: clients must not depend on them being fetchable.
API_ROOT = "https://www.googleapis.com/compute/v1"

# Calls that change something; everything else only reads (operations.wait
# is a POST but changes nothing).
MUTATING = frozenset(
    {
        "instances.insert",
        "instances.bulkInsert",
        "instances.delete",
        "instances.start",
        "instances.stop",
        "instances.resume",
        "instances.setLabels",
        "instances.setMetadata",
        "firewalls.insert",
        "firewalls.patch",
        "firewalls.update",
        "firewalls.delete",
    }
)

# A resource name, as GCE checks it (RFC 1035, at most 63 characters).
NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass
class Call:
    """One request as the fake saw it."""

    op: str  # discovery name, for example "instances.insert"
    method: str
    path: str
    query: dict[str, str]
    body: Any
    project: str | None
    zone: str | None
    name: str | None  # the instance / firewall / operation named in the path or body
    authorization: str | None
    status: int = 0  # the HTTP status the fake answered

    @property
    def mutating(self) -> bool:
        return self.op in MUTATING


# What the HTTP front calls for one API method: (call, path parameters,
# query, body) -> the answer's JSON. Each resource part lists its own.
Handler = Callable[[Call, dict[str, str], Any, Any], Any]


class ApiError(Exception):
    """An HTTP error answer, in the real API's shape."""

    def __init__(self, status: int, message: str, reason: str, domain: str = "global") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason
        self.domain = domain

    def payload(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.status,
                "message": self.message,
                "errors": [
                    {"message": self.message, "domain": self.domain, "reason": self.reason}
                ],
            }
        }


class OpFailure(Exception):
    """How an operation ends when it fails (its ``error`` field)."""

    def __init__(
        self, code: str, message: str, http_status: int = 400, http_message: str = "BAD REQUEST"
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.http_status = http_status
        self.http_message = http_message


def not_found(path: str) -> ApiError:
    """GCE's 404 for the resource at ``path`` (``projects/p/global/...``)."""
    return ApiError(404, f"The resource '{path}' was not found", "notFound")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def fingerprint(value: Any) -> str:
    digest = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).digest()
    return base64.b64encode(digest[:8]).decode()


def last(url: str | None) -> str:
    return (url or "").rstrip("/").rsplit("/", 1)[-1]


def resource_id() -> str:
    return str(secrets.randbelow(10**19 - 10**18) + 10**18)


def network_url(project: str, network: str | None) -> str:
    """The full URL of a network named by URL, by path or by bare name."""
    network = network or "global/networks/default"
    if network.startswith("https://"):
        return network
    if network.startswith("projects/"):
        return f"{API_ROOT}/{network}"
    if "/" not in network:
        network = f"global/networks/{network}"
    return f"{API_ROOT}/projects/{project}/{network}"


def page(
    kind: str, base: str, items: list[dict[str, Any]], query: Mapping[str, str]
) -> dict[str, Any]:
    """One page of a list answer (``maxResults`` / ``pageToken``)."""
    try:
        start = int(base64.urlsafe_b64decode(query["pageToken"]).decode()) if query.get(
            "pageToken"
        ) else 0
        size = int(query.get("maxResults") or 500)
    except ValueError:
        raise ApiError(400, "Invalid pageToken or maxResults", "invalid") from None
    out: dict[str, Any] = {"kind": kind, "id": base, "selfLink": f"{API_ROOT}/{base}"}
    chunk = items[start : start + size]
    if chunk:
        out["items"] = chunk
    if start + size < len(items):
        out["nextPageToken"] = base64.urlsafe_b64encode(str(start + size).encode()).decode()
    return out
