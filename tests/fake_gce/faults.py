"""Faults injected into the fake GCE's API, per call: an HTTP error answer
(``fail``), a zone out of capacity (``stockout``) or over quota
(``quota_exceeded``) when instances are created or started, and a test's
own code run when a request arrives (``hook``).

The HTTP front asks ``run_hooks`` and ``http_fault`` before it answers a
call; creating and starting instances ask ``capacity_fate``. What happens
to instances outside the API (preemption, a guest shutdown) is
lifecycle.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tests.fake_gce.api import ApiError, Call, OpFailure
from tests.fake_gce.world import World

# The reason and message of an HTTP error answer, by status, as GCE words them.
_REASONS = {
    400: "invalid",
    401: "authError",
    403: "forbidden",
    404: "notFound",
    409: "alreadyExists",
    429: "rateLimitExceeded",
    500: "backendError",
    503: "backendError",
}
_MESSAGES = {
    401: "Request is missing required authentication credential.",
    429: "Rate Limit Exceeded",
    500: "Internal error. Please try again or contact Google Support.",
    503: "The service is currently unavailable.",
}


@dataclass
class _HttpFault:
    op: str
    status: int
    reason: str
    message: str
    remaining: int | None
    name: str | None
    zone: str | None


@dataclass
class _ZoneFault:
    zone: str | None  # None: every zone
    ops: tuple[str, ...]  # "insert", "bulkInsert", "start"
    code: str
    message: str
    http_status: int
    http_message: str
    after: int  # this many calls succeed first
    remaining: int | None  # failures left; None: for ever
    leave_instance: bool  # a half-created TERMINATED instance stays behind
    http: bool  # answer the call itself with an HTTP error instead
    http_reason: tuple[str, str] = ("backendError", "global")  # its (reason, domain)


@dataclass
class _Hook:
    op: str
    fn: Callable[[Call], None]
    name: str | None
    remaining: int | None


class Faults:
    def __init__(self, world: World) -> None:
        self._world = world
        self._http_faults: list[_HttpFault] = []
        self._zone_faults: list[_ZoneFault] = []
        self._hooks: list[_Hook] = []
        self._zone_successes: dict[tuple[str, str], int] = {}

    # -- injection ----------------------------------------------------------------------

    def fail(
        self,
        op: str,
        status: int = 503,
        *,
        times: int | None = 1,
        reason: str | None = None,
        message: str | None = None,
        name: str | None = None,
        zone: str | None = None,
    ) -> None:
        """Answer the next ``times`` calls of ``op`` (optionally only for one
        instance name or zone) with an HTTP error; ``times=None``: always."""
        with self._world.lock:
            self._http_faults.append(
                _HttpFault(
                    op,
                    status,
                    reason or _REASONS.get(status, "error"),
                    message or _MESSAGES.get(status, f"fake error {status}"),
                    times,
                    name,
                    zone,
                )
            )

    def stockout(
        self,
        zone: str | None,
        *,
        code: str = "ZONE_RESOURCE_POOL_EXHAUSTED",
        after: int = 0,
        times: int | None = None,
        leave_instance: bool = False,
        ops: Sequence[str] = ("insert", "bulkInsert"),
        http: bool = False,
    ) -> None:
        """Creates in ``zone`` (None: all) end with a stockout in their
        operation, after ``after`` successful ones. The instance shows up
        PROVISIONING and vanishes, as on GCE; ``leave_instance`` keeps it,
        TERMINATED, to exercise a client's cleanup. ``http``: the call itself
        is answered HTTP 503 with the message (GCE answers some stockouts so:
        StanfordBioinformatics/loom#463 saw the bare message from an insert;
        no report shows that answer's `reason`, the fake says backendError)."""
        where = f"projects/{{project}}/zones/{zone or '{zone}'}"
        if code.endswith("_WITH_DETAILS"):
            message = (
                f"The zone '{where}' does not have enough resources available to fulfill "
                "the request.  '(resource type:compute)'."
            )
        else:
            message = (
                f"The zone '{where}' does not have enough resources available to fulfill "
                "the request.  Try a different zone, or try again later."
            )
        with self._world.lock:
            self._zone_faults.append(
                _ZoneFault(
                    zone, tuple(ops), code, message, 503, "SERVICE UNAVAILABLE", after, times,
                    leave_instance, http,
                )
            )

    def quota_exceeded(
        self,
        zone: str | None,
        *,
        metric: str = "CPUS",
        http: bool = False,
        times: int | None = None,
    ) -> None:
        """Creates in ``zone`` (None: all) exceed a regional quota: in the
        operation (QUOTA_EXCEEDED), or with ``http`` as a 403 answer."""
        region = zone.rsplit("-", 1)[0] if zone else "the region"
        message = f"Quota '{metric}' exceeded.  Limit: 8.0 in region {region}."
        with self._world.lock:
            self._zone_faults.append(
                _ZoneFault(
                    zone, ("insert", "bulkInsert"), "QUOTA_EXCEEDED", message, 403, "FORBIDDEN",
                    0, times, False, http, ("quotaExceeded", "usageLimits"),
                )
            )

    def hook(
        self,
        op: str,
        fn: Callable[[Call], None],
        *,
        name: str | None = None,
        times: int | None = 1,
    ) -> None:
        """Call ``fn(call)`` on the server thread when a matching request
        arrives, before it is handled (to interrupt a client mid-way, say).
        If ``fn`` raises ``ApiError``, that is the answer."""
        with self._world.lock:
            self._hooks.append(_Hook(op, fn, name, times))

    def clear(self) -> None:
        with self._world.lock:
            self._http_faults.clear()
            self._zone_faults.clear()
            self._hooks.clear()

    # -- what a call meets ------------------------------------------------------------

    def run_hooks(self, call: Call) -> None:
        with self._world.lock:
            hooks = []
            for hook in self._hooks:
                if hook.op != call.op or (hook.name and hook.name != call.name):
                    continue
                if hook.remaining is not None:
                    if hook.remaining <= 0:
                        continue
                    hook.remaining -= 1
                hooks.append(hook)
        for hook in hooks:
            hook.fn(call)

    def http_fault(self, call: Call) -> None:
        """Raise the ``ApiError`` a ``fail`` planted for this call, if any."""
        with self._world.lock:
            for fault in self._http_faults:
                if fault.op != call.op:
                    continue
                if fault.name and fault.name != call.name:
                    continue
                if fault.zone and fault.zone != call.zone:
                    continue
                if fault.remaining is not None:
                    if fault.remaining <= 0:
                        continue
                    fault.remaining -= 1
                raise ApiError(fault.status, fault.message, fault.reason)

    def capacity_fate(self, project: str, zone: str, op: str) -> tuple[OpFailure, bool] | None:
        """Whether this create/start in ``zone`` hits a stockout or quota:
        (the operation's error, leave a half-created instance)."""
        with self._world.lock:
            for fault in self._zone_faults:
                if op not in fault.ops or (fault.zone is not None and fault.zone != zone):
                    continue
                seen = self._zone_successes.get((zone, op), 0)
                if seen < fault.after:
                    continue
                if fault.remaining is not None:
                    if fault.remaining <= 0:
                        continue
                    fault.remaining -= 1
                message = fault.message.format(project=project, zone=zone)
                if fault.http:
                    raise ApiError(fault.http_status, message, *fault.http_reason)
                failure = OpFailure(fault.code, message, fault.http_status, fault.http_message)
                return failure, fault.leave_instance
            self._zone_successes[(zone, op)] = self._zone_successes.get((zone, op), 0) + 1
        return None
