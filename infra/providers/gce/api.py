"""The Compute API as the provider calls it: the clients (built on first
use, with ADC, a service-account key file or anonymous credentials, at
``gce.api_endpoint`` when set), the one retry policy around every call,
waiting on operations, and API failures as tfcluster errors.

``GceApi`` is the base the other parts of the provider (nodes, instances,
firewall, project checks, pricing) build on; it holds what they share.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from infra.config.loader import ClusterConfig
from infra.errors import CredentialsError, ProviderError, TfclusterError
from infra.providers.base import NodeProvider
from infra.providers.gce._google import auth_exceptions, client_options, compute_v1, requests
from infra.providers.gce.config import gce_config
from infra.providers.gce.errors import _as_tfcluster_error, _OperationFailed, _transient
from infra.providers.gce.parallel import (
    _R,
    _T,
    _check_cancelled,
    _mutation,
    _pause,
    parallel,
)
from infra.state.folder import ClusterState

if TYPE_CHECKING:

    from google.auth.credentials import Credentials

log = logging.getLogger("tfcluster")

COMPUTE_SCOPE = "https://www.googleapis.com/auth/compute"

# Seconds for one ordinary API call (the server's own limit is similar).
_CALL_TIMEOUT_S = 60.0
# operations.wait holds the request up to 2 minutes server-side.
_WAIT_CALL_S = 120.0

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for transient API failures: ``attempts`` tries at most, the
    whole retrying bounded by ``deadline_s``."""

    attempts: int = 6
    initial_s: float = 1.0
    max_delay_s: float = 20.0
    deadline_s: float = 120.0


def _last(url: str | None) -> str:
    return (url or "").rstrip("/").rsplit("/", 1)[-1]


def _retried(
    what: str, *, mutates: bool, changes_instances: bool = True
) -> Callable[[_F], _F]:
    """Retry the decorated API call on transient failures (see ``_transient``)
    with exponential backoff and jitter, within ``self.retry_policy``; give
    up with a ProviderError naming ``what`` (formatted with the call's
    arguments, ``self`` included). Other exceptions pass through at once.

    ``mutates``: the call changes something (creates, deletes, starts,
    stops, sets); an interrupted batch waits for such a call to be answered
    (see ``parallel``). Every call says which it is. A mutating call that
    ``changes_instances`` (all but the firewall's) forgets the last listing
    (``_listed``)."""

    def decorate(fn: _F) -> _F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(self: GceApi, *args: Any, **kwargs: Any) -> Any:
            policy = self.retry_policy
            started = time.monotonic()
            delay = policy.initial_s
            attempt = 0
            while True:
                _check_cancelled()
                attempt += 1
                if mutates and changes_instances:
                    self._listed = None
                try:
                    with _mutation() if mutates else contextlib.nullcontext():
                        return fn(self, *args, **kwargs)
                except Exception as exc:
                    why = _transient(exc, self._endpoint)
                    if why is None:
                        raise
                    elapsed = time.monotonic() - started
                    if attempt >= policy.attempts or elapsed + delay > policy.deadline_s:
                        bound = signature.bind(self, *args, **kwargs)
                        raise ProviderError(
                            f"{what.format(**bound.arguments)}: {why}; gave up after "
                            f"{attempt} attempts in {elapsed:.0f} s",
                            hint="run the command again later; it carries on from where "
                            "this one stopped",
                        ) from exc
                    log.debug("%s: %s; retrying in %.1f s", fn.__name__, why, delay)
                    # Jitter: parallel workers that failed together must not
                    # come back in lockstep.
                    _pause(random.uniform(delay / 2, delay))
                    delay = min(delay * 2, policy.max_delay_s)

        return cast("_F", wrapper)

    return decorate


@dataclass
class _Clients:
    project: str
    instances: compute_v1.InstancesClient
    firewalls: compute_v1.FirewallsClient
    zone_operations: compute_v1.ZoneOperationsClient
    global_operations: compute_v1.GlobalOperationsClient
    images: compute_v1.ImagesClient
    networks: compute_v1.NetworksClient
    projects: compute_v1.ProjectsClient


class GceApi(NodeProvider):
    """What every part of the GCE provider shares: its names, clients,
    retried calls' policy, operations and parallel batches."""

    # Class attributes so that tests can make them quick for every instance.
    retry_policy = RetryPolicy()
    poll_interval_s = 2.0

    def __init__(self, config: ClusterConfig, state: ClusterState) -> None:
        super().__init__(config, state)
        self.gce = gce_config(config)
        self.network_tag = f"tfcluster-{config.name}"
        self.grpc_rule = f"tfcluster-{config.name}-grpc"
        self.ssh_rule = f"tfcluster-{config.name}-ssh"
        self.deny_rule = f"tfcluster-{config.name}-grpc-deny"
        self.ssh_deny_rule = f"tfcluster-{config.name}-ssh-deny"
        # Read from the API by ``prepare`` (check_plan): the image's size.
        self._image_gb: int | None = None
        self._oslogin = False
        # check_config passed: cluster.yaml and what the API said of it do
        # not change within one command, which asks it up to three times.
        self._config_checked = False
        self._clients_lock = threading.Lock()
        self._clients: _Clients | None = None
        self._unpriced: set[str] = set()
        # Boot disk GB per node as listed (a Deep Learning VM disk is ~50 GB).
        self._disk_gb: dict[str, int] = {}
        self._warned: set[str] = set()
        # Instances of the cluster's name another state made: name -> its id.
        self.foreign: dict[str, str] = {}
        # The last listing of the cluster's instances (``GceNodes._instances``)
        # while no call of this provider changed anything since: the next
        # step of the same command (`up`'s prepare) reads it instead of
        # listing again. Any mutating call forgets it.
        self._listed: dict[str, list[compute_v1.Instance]] | None = None

    @property
    def _endpoint(self) -> str:
        return self.gce.api_endpoint or "https://compute.googleapis.com"

    @property
    def api(self) -> _Clients:
        """The Compute clients, built on first use: constructing the provider
        (every command does) needs no credentials and makes no call."""
        with self._clients_lock:
            if self._clients is None:
                credentials, credentials_project = self._credentials()
                project = (
                    self.gce.project
                    or os.environ.get("GOOGLE_CLOUD_PROJECT")
                    or credentials_project
                )
                if not project:
                    raise CredentialsError(
                        "no Google Cloud project: set gce.project in cluster.yaml or "
                        "export GOOGLE_CLOUD_PROJECT",
                        hint="or `gcloud config set project PROJECT_ID` before "
                        "`gcloud auth application-default login`",
                    )
                options = (
                    client_options.ClientOptions(api_endpoint=self.gce.api_endpoint)
                    if self.gce.api_endpoint
                    else None
                )
                kwargs: dict[str, Any] = {"credentials": credentials, "client_options": options}
                self._clients = _Clients(
                    project=project,
                    instances=compute_v1.InstancesClient(**kwargs),
                    firewalls=compute_v1.FirewallsClient(**kwargs),
                    zone_operations=compute_v1.ZoneOperationsClient(**kwargs),
                    global_operations=compute_v1.GlobalOperationsClient(**kwargs),
                    images=compute_v1.ImagesClient(**kwargs),
                    networks=compute_v1.NetworksClient(**kwargs),
                    projects=compute_v1.ProjectsClient(**kwargs),
                )
            return self._clients

    def _credentials(self) -> tuple[Credentials, str | None]:
        spec = self.gce.credentials
        if spec == "anonymous":
            from google.auth.credentials import AnonymousCredentials

            return AnonymousCredentials(), None
        if spec == "adc":
            import google.auth

            try:
                credentials, project = google.auth.default(scopes=[COMPUTE_SCOPE])
            except auth_exceptions.DefaultCredentialsError as exc:
                raise CredentialsError(
                    "no Google application default credentials: run "
                    "`gcloud auth application-default login` (or set gce.credentials to a "
                    "service-account key file)",
                    hint=str(exc).splitlines()[0] if str(exc) else None,
                ) from None
            return credentials, project
        from google.oauth2 import service_account

        path = self.config.resolve(spec)
        if not path.is_file():
            raise CredentialsError(
                f"gce.credentials: {path} does not exist; give the path of a service-account "
                "JSON key, or use credentials: adc"
            )
        try:
            sa = service_account.Credentials.from_service_account_file(
                str(path), scopes=[COMPUTE_SCOPE]
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CredentialsError(
                f"gce.credentials: {path} is not a usable service-account JSON key ({exc}); "
                "create one with `gcloud iam service-accounts keys create`"
            ) from None
        return sa, sa.project_id

    @contextlib.contextmanager
    def _api_errors(self, what: str) -> Iterator[None]:
        """API failures on this thread as one-line tfcluster errors."""
        try:
            yield
        except TfclusterError:
            raise
        except Exception as exc:
            error = _as_tfcluster_error(exc, self._endpoint)
            if error is None:
                raise
            raise type(error)(f"{what}: {error}", hint=error.hint) from exc

    def _network(self) -> str:
        network = self.gce.network
        return network if "/" in network else f"global/networks/{network}"

    @_retried("wait for operation {name}", mutates=False)
    def _poll_operation(
        self, zone: str | None, name: str, budget: float, project: str | None = None
    ) -> compute_v1.Operation:
        project = project or self.api.project
        try:
            if zone:
                return self.api.zone_operations.wait(
                    project=project,
                    zone=zone,
                    operation=name,
                    retry=None,
                    timeout=min(budget, _WAIT_CALL_S) + 10,
                )
            return self.api.global_operations.wait(
                project=project,
                operation=name,
                retry=None,
                timeout=min(budget, _WAIT_CALL_S) + 10,
            )
        except requests.exceptions.ReadTimeout:
            # The server held the wait longer than our budget: look instead.
            if zone:
                return self.api.zone_operations.get(
                    project=project,
                    zone=zone,
                    operation=name,
                    retry=None,
                    timeout=_CALL_TIMEOUT_S,
                )
            return self.api.global_operations.get(
                project=project, operation=name, retry=None, timeout=_CALL_TIMEOUT_S
            )

    def _wait_operation(
        self, op: compute_v1.Operation, *, zone: str | None, what: str
    ) -> compute_v1.Operation:
        """Wait until ``op`` is DONE (at most gce.operation_timeout); raise
        ``_OperationFailed`` when it ended with an error."""
        timeout = self.gce.operation_timeout
        deadline = time.monotonic() + timeout
        while op.status != compute_v1.Operation.Status.DONE:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProviderError(
                    f"{what}: operation {op.name} not done after {timeout:g} s "
                    "(gce.operation_timeout); it may still finish",
                    hint="`deploy.py status` shows where the nodes got; run the command "
                    "again, or raise gce.operation_timeout",
                )
            # A Shared VPC's firewall operations live in the host project.
            owner = re.search(r"/projects/([^/]+)/", op.self_link or "")
            op = self._poll_operation(zone, op.name, remaining, owner[1] if owner else None)
        errors = [(e.code, e.message) for e in op.error.errors]
        if errors:
            raise _OperationFailed(op.name, errors, op.http_error_status_code)
        return op

    def _parallel(
        self, fn: Callable[[_T], _R], items: Sequence[_T]
    ) -> tuple[dict[_T, _R], dict[_T, BaseException]]:
        """``fn`` on every item at once (``parallel.parallel``)."""
        return parallel(fn, items)

    def _raise_errors(self, errors: Mapping[Any, BaseException], what: str) -> None:
        """One tfcluster error for the failures of a parallel batch, naming
        each item; the most specific class that covers them all."""
        if not errors:
            return
        converted: dict[str, TfclusterError] = {}
        for item, exc in errors.items():
            error = _as_tfcluster_error(exc, self._endpoint)
            if error is None:
                raise exc  # a bug: let its traceback through
            converted[str(item)] = error
        kinds = {type(e) for e in converted.values()}
        if any(issubclass(k, CredentialsError) for k in kinds):
            cls: type[TfclusterError] = CredentialsError
        elif len(kinds) == 1:
            cls = kinds.pop()
        else:
            cls = ProviderError
        hints = {e.hint for e in converted.values() if e.hint}
        message = "; ".join(f"{item}: {e}" for item, e in sorted(converted.items()))
        raise cls(f"{what}: {message}", hint=next(iter(hints)) if len(hints) == 1 else None)

    def _poll_delays(self) -> Iterator[float]:
        """Pauses between two looks at a changing state: quick at first (the
        change is often imminent), growing to ``poll_interval_s``."""
        delay = self.poll_interval_s / 8
        while True:
            yield delay
            delay = min(delay * 1.5, self.poll_interval_s)
