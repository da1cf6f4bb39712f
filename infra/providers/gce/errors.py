"""How Compute API failures read: which are worth retrying, which mean
"not in this zone, not now" (the caller tries the next zone), and the
one-line tfcluster error each becomes for the user."""

from __future__ import annotations

import re
from collections.abc import Mapping

from infra.errors import (
    CapacityError,
    CredentialsError,
    Interrupted,
    ProviderError,
    TfclusterError,
)
from infra.providers.gce._google import api_exceptions, auth_exceptions, requests

# Operation error codes that mean "not in this zone, not now": try the next zone.
_CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "QUOTA_EXCEEDED",
        # A Spot VM preempted while it was being created.
        "UNSUPPORTED_OPERATION",
    }
)

# A 400 that says a machine or GPU type is not offered in this zone:
# "Invalid value for field 'resource.machineType': '...'. Machine type with
# name 'g2-standard-4' does not exist in zone 'us-central1-f'."
_NOT_IN_ZONE = re.compile(
    r"(machine ?type|accelerator ?type|disk ?type)[^.]*(does not exist|not (available|"
    r"supported|found)) in (the )?zone",
    re.IGNORECASE,
)

# A zonal type this zone does not offer, in the words of a missing resource,
# answered as 404 or as 400 `badRequest` depending on the path: "googleapi:
# Error 400: The resource 'projects/ci-test-project-188019/zones/us-central1-f/
# acceleratorTypes/nvidia-tesla-k80' was not found, badRequest"
# (hashicorp/terraform-provider-google#5860); `gcloud compute instances
# create`: "Could not fetch resource: - The resource 'projects/.../zones/
# us-west1-b/acceleratorTypes/nvidia-tesla-p4' was not found"
# (fastai/course-v3#430). {zone} is filled in: another zone's or a
# regional resource (a subnetwork) missing is no reason to move on.
_TYPE_NOT_FOUND = (
    r"The resource 'projects/[^/']+/zones/{zone}/(acceleratorTypes|machineTypes|diskTypes)/"
    r"[^/']+' was not found"
)

# A zone the API does not know (400 `invalid`): "Invalid value for field
# 'zone': 'us-east1'. Unknown zone." (inspec/inspec-gcp#301, the whole body).
_UNKNOWN_ZONE = re.compile(r"Invalid value for field 'zone': '[^']*'\. Unknown zone")

# A stockout, whether in an operation's error (ZONE_RESOURCE_POOL_EXHAUSTED
# [_WITH_DETAILS]) or answered at once as HTTP 503 with the message alone:
# "The zone 'projects/P/zones/us-central1-b' does not have enough resources
# available to fulfill the request.  Try a different zone, or try again
# later." (StanfordBioinformatics/loom#463, GoogleCloudPlatform/
# compute-image-tools#1960).
_STOCKOUT = re.compile(r"RESOURCE_POOL_EXHAUSTED|does not have enough resources available")

# HTTP answers worth another try: rate limits and server trouble.
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_RATE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})


class _OperationFailed(Exception):
    """An operation ended DONE with an ``error``."""

    def __init__(self, name: str, errors: list[tuple[str, str]], http_status: int) -> None:
        self.name = name
        self.errors = errors
        self.http_status = http_status
        super().__init__(self.reason)

    @property
    def codes(self) -> list[str]:
        return [code for code, _ in self.errors]

    @property
    def capacity(self) -> bool:
        return any(code in _CAPACITY_CODES for code in self.codes)

    @property
    def reason(self) -> str:
        # Messages end with a full stop; ours are joined with "; ".
        return "; ".join(f"{code}: {message.rstrip('. ')}" for code, message in self.errors)


class _ZoneUnusable(Exception):
    """This zone cannot have the node now (stockout, quota, type not offered)."""


class _Cancelled(Exception):
    """The main thread was interrupted: a worker makes no further calls."""


def _api_message(exc: api_exceptions.GoogleAPICallError) -> str:
    """The API's own message, without the client's 'POST https://...:' prefix."""
    for error in exc.errors or ():
        if isinstance(error, Mapping) and error.get("message"):
            return str(error["message"])
    return str(exc.message)


def _reasons(exc: api_exceptions.GoogleAPICallError) -> set[str]:
    return {
        str(error.get("reason"))
        for error in exc.errors or ()
        if isinstance(error, Mapping) and error.get("reason")
    }


def _is_quota(exc: api_exceptions.GoogleAPICallError) -> bool:
    return "quotaExceeded" in _reasons(exc) or "Quota '" in _api_message(exc)


def not_in_zone(message: str, zone: str) -> bool:
    """Whether an insert's 404 or 400 says that ``zone`` does not offer the
    machine, GPU or disk type asked for (another zone may)."""
    found = re.search(_TYPE_NOT_FOUND.format(zone=re.escape(zone)), message)
    return found is not None or _NOT_IN_ZONE.search(message) is not None


def unknown_zone(message: str) -> bool:
    return _UNKNOWN_ZONE.search(message) is not None


def is_stockout(message: str) -> bool:
    return _STOCKOUT.search(message) is not None


def _transient(exc: BaseException, endpoint: str) -> str | None:
    """Why ``exc`` is worth retrying (worded for the final error), or None
    when it is not."""
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        code = exc.code if isinstance(exc.code, int) else 0
        message = _api_message(exc)
        if code in _RETRY_STATUS:
            if is_stockout(message):
                return None  # not now, not here: the caller moves to another zone
            return f"the Compute API kept answering HTTP {code}: {message.rstrip('. ')}"
        if code == 403 and _reasons(exc) & _RATE_REASONS:
            return f"the Compute API kept rate-limiting: {message.rstrip('. ')}"
        return None
    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return f"cannot reach the Compute API at {endpoint} ({type(exc).__name__})"
    if isinstance(exc, auth_exceptions.TransportError):
        return f"cannot reach Google's token service ({exc})"
    return None


def _as_tfcluster_error(exc: BaseException, endpoint: str) -> TfclusterError | None:
    """The user-facing error for an API failure; None for a bug."""
    if isinstance(exc, TfclusterError):
        return exc
    if isinstance(exc, _Cancelled):
        return Interrupted("interrupted")
    if isinstance(exc, _ZoneUnusable):
        return CapacityError(str(exc))
    if isinstance(exc, _OperationFailed):
        return CapacityError(exc.reason) if exc.capacity else ProviderError(exc.reason)
    if isinstance(exc, api_exceptions.Unauthorized):
        return CredentialsError(
            f"the Compute API rejected the credentials ({_api_message(exc)})",
            hint="run `gcloud auth application-default login`, or check gce.credentials",
        )
    if isinstance(exc, api_exceptions.Forbidden):
        if _is_quota(exc):
            return CapacityError(f"QUOTA_EXCEEDED: {_api_message(exc)}")
        return CredentialsError(
            f"permission denied: {_api_message(exc)}",
            hint="the account needs roles/compute.instanceAdmin.v1 and "
            "roles/compute.securityAdmin on the project, with the Compute Engine API enabled "
            "(gcloud services enable compute.googleapis.com)",
        )
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        if is_stockout(_api_message(exc)):
            return CapacityError(_api_message(exc))
        return ProviderError(f"HTTP {exc.code}: {_api_message(exc)}")
    if isinstance(exc, auth_exceptions.RefreshError | auth_exceptions.DefaultCredentialsError):
        return CredentialsError(
            f"cannot get a Google access token: {str(exc).splitlines()[0]}",
            hint="run `gcloud auth application-default login`, or check gce.credentials",
        )
    if isinstance(exc, requests.exceptions.RequestException | auth_exceptions.TransportError):
        return ProviderError(f"cannot reach the Compute API at {endpoint}: {type(exc).__name__}")
    return None
