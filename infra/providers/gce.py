"""Provider ``gce``: the cluster's nodes are Compute Engine instances.

The only module that calls the Compute API. What exists is what the API
lists with the label ``tfcluster-cluster=<name>`` (across the whole
project, so that nodes in a zone no longer listed in ``gce.zones`` are
still found and deleted); nothing is remembered locally but the SSH key.

How it talks to the API:

* ``google-cloud-compute`` clients over REST, at ``gce.api_endpoint`` when
  set (an emulator or the test fake), with ADC, a service-account key file
  or anonymous credentials.
* One retry decorator (``_retried``) around every call: exponential backoff
  with jitter on 429, 5xx, rate-limit 403s and connection errors, bounded
  in attempts and time. The client library's own retries are switched off
  (``retry=None``) so that there is exactly one policy.
* Mutating calls answer with an Operation; ``_wait_operation`` waits on it
  with our own Zone/GlobalOperationsClient ``wait`` (the client library's
  ``ExtendedOperation.result()`` would poll Google's endpoint whatever the
  configured one), bounded by ``gce.operation_timeout``, and reads its
  ``error`` itself.
* Everything that touches several nodes runs them in parallel threads
  (``_parallel``): four nodes take about as long as one. The threads are
  daemons and stop making calls once the main thread is interrupted, so a
  Ctrl-C returns at once; what was already requested carries the label and
  is found (and deleted) by the next ``up`` or ``down``.

Creation places a batch of new nodes in one zone (TensorFlow's gRPC
traffic between zones is slower and billed): first the zone the cluster's
existing nodes are in, then ``gce.zones`` in order. When a zone is out of
capacity or quota, what the batch created there is deleted and the whole
batch moves to the next zone; when none can take it, ``CapacityError``
lists every zone's reason.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import queue
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import requests
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.auth import exceptions as auth_exceptions
from google.cloud import compute_v1

from infra import pricing
from infra.config import ClusterConfig
from infra.errors import (
    CapacityError,
    ConfigError,
    CredentialsError,
    Interrupted,
    ProviderError,
    StateError,
    TfclusterError,
)
from infra.keys import cluster_key
from infra.providers.base import Node, NodeProvider, NodeState
from infra.state import ClusterState

if TYPE_CHECKING:
    from pathlib import Path

    from google.auth.credentials import Credentials

    from infra.transport import Transport

log = logging.getLogger("tfcluster")

CLUSTER_LABEL = "tfcluster-cluster"
ROLE_LABEL = "tfcluster-role"
COMPUTE_SCOPE = "https://www.googleapis.com/auth/compute"

_STATES = {
    "PROVISIONING": NodeState.PENDING,
    "STAGING": NodeState.PENDING,
    "REPAIRING": NodeState.PENDING,
    "RUNNING": NodeState.RUNNING,
    "STOPPING": NodeState.STOPPING,
    "SUSPENDING": NodeState.STOPPING,
    "TERMINATED": NodeState.STOPPED,
    "SUSPENDED": NodeState.STOPPED,
}

# Operation error codes that mean "not in this zone, not now": try the next zone.
_CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "QUOTA_EXCEEDED",
    }
)
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_RATE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")

# Seconds for one ordinary API call (the server's own limit is similar).
_CALL_TIMEOUT_S = 60.0
# operations.wait holds the request up to 2 minutes server-side.
_WAIT_CALL_S = 120.0
# The client's HTTP session pools 10 connections per client: more threads
# than that would open and throw away extra connections.
_MAX_PARALLEL = 10

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T", bound=Hashable)
_R = TypeVar("_R")


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for transient API failures: ``attempts`` tries at most, the
    whole retrying bounded by ``deadline_s``."""

    attempts: int = 6
    initial_s: float = 1.0
    max_delay_s: float = 20.0
    deadline_s: float = 120.0


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


# Worker threads of one ``_parallel`` batch share its cancel event.
_tls = threading.local()


def _current_cancel() -> threading.Event | None:
    return cast("threading.Event | None", getattr(_tls, "cancel", None))


def _check_cancelled() -> None:
    event = _current_cancel()
    if event is not None and event.is_set():
        raise _Cancelled


def _pause(seconds: float) -> None:
    """Sleep, but end at once (with _Cancelled) when the batch is cancelled."""
    event = _current_cancel()
    if event is None:
        time.sleep(seconds)
    elif event.wait(seconds):
        raise _Cancelled


def _last(url: str | None) -> str:
    return (url or "").rstrip("/").rsplit("/", 1)[-1]


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


def _transient(exc: BaseException, endpoint: str) -> str | None:
    """Why ``exc`` is worth retrying (worded for the final error), or None
    when it is not."""
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        code = exc.code if isinstance(exc.code, int) else 0
        message = _api_message(exc)
        if code in _RETRY_STATUS:
            if "RESOURCE_POOL_EXHAUSTED" in message:
                return None  # a stockout: the caller moves to another zone
            return f"the Compute API kept answering HTTP {code}: {message.rstrip('. ')}"
        if code == 403 and _reasons(exc) & _RATE_REASONS:
            return f"the Compute API kept rate-limiting: {message.rstrip('. ')}"
        return None
    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return f"cannot reach the Compute API at {endpoint} ({type(exc).__name__})"
    if isinstance(exc, auth_exceptions.TransportError):
        return f"cannot reach Google's token service ({exc})"
    return None


def _retried(what: str) -> Callable[[_F], _F]:
    """Retry the decorated API call on transient failures (see ``_transient``)
    with exponential backoff and jitter, within ``self.retry_policy``; give
    up with a ProviderError naming ``what`` (formatted with the call's
    arguments, ``self`` included). Other exceptions pass through at once."""

    def decorate(fn: _F) -> _F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(self: GceProvider, *args: Any, **kwargs: Any) -> Any:
            policy = self.retry_policy
            started = time.monotonic()
            delay = policy.initial_s
            attempt = 0
            while True:
                _check_cancelled()
                attempt += 1
                try:
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
        return ProviderError(f"HTTP {exc.code}: {_api_message(exc)}")
    if isinstance(exc, auth_exceptions.RefreshError | auth_exceptions.DefaultCredentialsError):
        return CredentialsError(
            f"cannot get a Google access token: {str(exc).splitlines()[0]}",
            hint="run `gcloud auth application-default login`, or check gce.credentials",
        )
    if isinstance(exc, requests.exceptions.RequestException | auth_exceptions.TransportError):
        return ProviderError(f"cannot reach the Compute API at {endpoint}: {type(exc).__name__}")
    return None


@dataclass
class _Clients:
    project: str
    instances: compute_v1.InstancesClient
    firewalls: compute_v1.FirewallsClient
    zone_operations: compute_v1.ZoneOperationsClient
    global_operations: compute_v1.GlobalOperationsClient


class GceProvider(NodeProvider):
    """Compute Engine instances labelled ``tfcluster-cluster=<name>``."""

    kind = "gce"
    # Class attributes so that tests can make them quick for every instance.
    retry_policy = RetryPolicy()
    poll_interval_s = 2.0

    def __init__(self, config: ClusterConfig, state: ClusterState) -> None:
        super().__init__(config, state)
        self.gce = config.gce
        self.network_tag = f"tfcluster-{config.name}"
        self.grpc_rule = f"tfcluster-{config.name}-grpc"
        self.ssh_rule = f"tfcluster-{config.name}-ssh"
        self._check_labels()
        self._clients_lock = threading.Lock()
        self._clients: _Clients | None = None
        self._unpriced: set[str] = set()
        self._warned: set[str] = set()

    # -- configuration ----------------------------------------------------------------

    def _check_labels(self) -> None:
        # GCE would refuse these only at create time, after the firewall
        # rules exist; a bad label is a cluster.yaml mistake: say so first.
        for key, value in self.gce.labels.items():
            if key in (CLUSTER_LABEL, ROLE_LABEL):
                raise ConfigError(f"gce.labels: {key} is tfcluster's own label; use another key")
            if not _LABEL_KEY.match(key):
                raise ConfigError(
                    f"gce.labels: {key!r} is not a valid GCE label key: lowercase letters, "
                    "digits, '_' and '-', starting with a letter, at most 63 characters"
                )
            if not isinstance(value, str) or not _LABEL_VALUE.match(value):
                raise ConfigError(
                    f"gce.labels.{key}: {value!r} is not a valid GCE label value: lowercase "
                    "letters, digits, '_' and '-', at most 63 characters"
                )

    def _labels(self, name: str) -> dict[str, str]:
        roles = self.config.roles_of(name)
        return {
            **self.gce.labels,
            CLUSTER_LABEL: self.config.name,
            ROLE_LABEL: "-".join(roles) if roles else "none",
        }

    def _key(self) -> tuple[Path, str]:
        return cluster_key(
            self.config.ssh.key_file, self.state.key_file, f"tfcluster-{self.config.name}"
        )

    @property
    def _endpoint(self) -> str:
        return self.gce.api_endpoint or "https://compute.googleapis.com"

    # -- clients -----------------------------------------------------------------------

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
                    ClientOptions(api_endpoint=self.gce.api_endpoint)
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

    # -- raw API calls (each retried) -----------------------------------------------------

    @_retried("list the instances of cluster {self.config.name}")
    def _list_cluster(self) -> list[compute_v1.Instance]:
        request = compute_v1.AggregatedListInstancesRequest(
            project=self.api.project, filter=f'labels.{CLUSTER_LABEL} = "{self.config.name}"'
        )
        found: list[compute_v1.Instance] = []
        pages = self.api.instances.aggregated_list(
            request=request, retry=None, timeout=_CALL_TIMEOUT_S
        )
        for _scope, scoped in pages:
            found.extend(scoped.instances)
        return found

    @_retried("list the instances of cluster {self.config.name} in {zone}")
    def _list_zone(self, zone: str) -> list[compute_v1.Instance]:
        request = compute_v1.ListInstancesRequest(
            project=self.api.project,
            zone=zone,
            filter=f'labels.{CLUSTER_LABEL} = "{self.config.name}"',
        )
        return list(self.api.instances.list(request=request, retry=None, timeout=_CALL_TIMEOUT_S))

    @_retried("get instance {name} in {zone}")
    def _get_instance(self, zone: str, name: str) -> compute_v1.Instance | None:
        try:
            return self.api.instances.get(
                project=self.api.project, zone=zone, instance=name, retry=None,
                timeout=_CALL_TIMEOUT_S,
            )
        except api_exceptions.NotFound:
            return None

    @_retried("create instance {name} in {zone}")
    def _insert_instance(
        self, zone: str, name: str, body: compute_v1.Instance
    ) -> compute_v1.Operation:
        return self.api.instances.insert_unary(
            project=self.api.project, zone=zone, instance_resource=body, retry=None,
            timeout=_CALL_TIMEOUT_S,
        )

    @_retried("{action} instance {name} in {zone}")
    def _instance_action(self, action: str, zone: str, name: str) -> compute_v1.Operation | None:
        """start, stop, resume or delete; None when the instance is gone (404)."""
        method = getattr(self.api.instances, f"{action}_unary")
        try:
            return cast(
                "compute_v1.Operation",
                method(
                    project=self.api.project, zone=zone, instance=name, retry=None,
                    timeout=_CALL_TIMEOUT_S,
                ),
            )
        except api_exceptions.NotFound:
            return None

    @_retried("set the labels of {name} in {zone}")
    def _set_labels(
        self, zone: str, name: str, labels: dict[str, str], fingerprint: str
    ) -> compute_v1.Operation:
        return self.api.instances.set_labels_unary(
            project=self.api.project,
            zone=zone,
            instance=name,
            instances_set_labels_request_resource=compute_v1.InstancesSetLabelsRequest(
                labels=labels, label_fingerprint=fingerprint
            ),
            retry=None,
            timeout=_CALL_TIMEOUT_S,
        )

    @_retried("set the metadata of {name} in {zone}")
    def _set_metadata(
        self, zone: str, name: str, metadata: compute_v1.Metadata
    ) -> compute_v1.Operation:
        return self.api.instances.set_metadata_unary(
            project=self.api.project, zone=zone, instance=name, metadata_resource=metadata,
            retry=None, timeout=_CALL_TIMEOUT_S,
        )

    @_retried("get firewall rule {name}")
    def _get_firewall(self, name: str) -> compute_v1.Firewall | None:
        try:
            return self.api.firewalls.get(
                project=self.api.project, firewall=name, retry=None, timeout=_CALL_TIMEOUT_S
            )
        except api_exceptions.NotFound:
            return None

    @_retried("create firewall rule {body.name}")
    def _insert_firewall(self, body: compute_v1.Firewall) -> compute_v1.Operation:
        return self.api.firewalls.insert_unary(
            project=self.api.project, firewall_resource=body, retry=None,
            timeout=_CALL_TIMEOUT_S,
        )

    @_retried("update firewall rule {body.name}")
    def _update_firewall(self, body: compute_v1.Firewall) -> compute_v1.Operation:
        # update (PUT) replaces the rule: a field the rule should not have
        # (a stray sourceRanges) is cleared, which PATCH would keep.
        return self.api.firewalls.update_unary(
            project=self.api.project, firewall=body.name, firewall_resource=body, retry=None,
            timeout=_CALL_TIMEOUT_S,
        )

    @_retried("delete firewall rule {name}")
    def _delete_firewall(self, name: str) -> compute_v1.Operation | None:
        try:
            return self.api.firewalls.delete_unary(
                project=self.api.project, firewall=name, retry=None, timeout=_CALL_TIMEOUT_S
            )
        except api_exceptions.NotFound:
            return None

    @_retried("wait for operation {name}")
    def _poll_operation(self, zone: str | None, name: str, budget: float) -> compute_v1.Operation:
        project = self.api.project
        try:
            if zone:
                return self.api.zone_operations.wait(
                    project=project, zone=zone, operation=name, retry=None,
                    timeout=min(budget, _WAIT_CALL_S) + 10,
                )
            return self.api.global_operations.wait(
                project=project, operation=name, retry=None,
                timeout=min(budget, _WAIT_CALL_S) + 10,
            )
        except requests.exceptions.ReadTimeout:
            # The server held the wait longer than our budget: look instead.
            if zone:
                return self.api.zone_operations.get(
                    project=project, zone=zone, operation=name, retry=None,
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
            op = self._poll_operation(zone, op.name, remaining)
        errors = [(e.code, e.message) for e in op.error.errors]
        if errors:
            raise _OperationFailed(op.name, errors, op.http_error_status_code)
        return op

    # -- parallel work ------------------------------------------------------------------------

    def _parallel(
        self, fn: Callable[[_T], _R], items: Sequence[_T]
    ) -> tuple[dict[_T, _R], dict[_T, BaseException]]:
        """``fn`` on every item at once; (results, errors) by item.

        Daemon threads: an interrupted main thread returns at once and the
        process can exit; the batch's cancel event stops the workers from
        making further calls (each checks it before every call and sleep)."""
        results: dict[_T, _R] = {}
        errors: dict[_T, BaseException] = {}
        if not items:
            return results, errors
        cancel = _current_cancel() or threading.Event()
        done: queue.Queue[tuple[_T, bool, Any]] = queue.Queue()
        slots = threading.Semaphore(_MAX_PARALLEL)

        def run(item: _T) -> None:
            _tls.cancel = cancel
            with slots:
                try:
                    _check_cancelled()
                    done.put((item, True, fn(item)))
                except BaseException as exc:  # handed to the caller, whatever it is
                    done.put((item, False, exc))

        try:
            # Starting the threads is inside the try: an interrupt that lands
            # while the later ones start must still cancel the earlier ones.
            for item in items:
                threading.Thread(
                    target=run, args=(item,), daemon=True, name=f"gce-{item}"
                ).start()
            for _ in items:
                while True:
                    # A timed wait: a SIGINT the kernel hands to another thread
                    # only sets Python's flag, which the main thread checks when
                    # it runs again; an untimed wait would sleep on until a
                    # worker finishes.
                    try:
                        item, ok, value = done.get(timeout=0.2)
                        break
                    except queue.Empty:
                        continue
                if ok:
                    results[item] = value
                else:
                    errors[item] = value
        except BaseException:
            cancel.set()
            raise
        return results, errors

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

    # -- what exists ----------------------------------------------------------------------

    def _instances(self) -> dict[str, list[compute_v1.Instance]]:
        """This cluster's instances by name (several only if one name exists
        in two zones, which a failed cleanup could leave)."""
        by_name: dict[str, list[compute_v1.Instance]] = {}
        for inst in self._list_cluster():
            by_name.setdefault(inst.name, []).append(inst)
        for name, found in by_name.items():
            if len(found) > 1 and name not in self._warned:
                self._warned.add(name)  # once, not on every poll
                log.warning(
                    "%s exists in %s; `deploy.py down` deletes all of them",
                    name, ", ".join(_last(i.zone) for i in found),
                )
        return by_name

    def non_terminated_nodes(self) -> list[Node]:
        with self._api_errors(f"listing the nodes of {self.config.name}"):
            instances = self._instances()
        order = {name: i for i, name in enumerate(self.config.nodes)}
        nodes = [self._node(found[0]) for found in instances.values()]
        return sorted(nodes, key=lambda n: (order.get(n.name, len(order)), n.name))

    def _node(self, inst: compute_v1.Instance) -> Node:
        nic = inst.network_interfaces[0] if inst.network_interfaces else None
        internal = (nic.network_i_p or None) if nic else None
        external = None
        if nic:
            external = next((a.nat_i_p for a in nic.access_configs if a.nat_i_p), None)
        accelerators = ", ".join(
            f"{a.accelerator_count} x {_last(a.accelerator_type)}"
            for a in inst.guest_accelerators
        )
        scheduling = inst.scheduling
        return Node(
            name=inst.name,
            state=_STATES.get(inst.status, NodeState.PENDING),
            status=inst.status,
            internal_ip=internal,
            external_ip=external,
            ssh_host=external,
            ssh_port=self.config.ssh.port,
            zone=_last(inst.zone),
            machine_type=_last(inst.machine_type),
            accelerators=accelerators or None,
            preemptible=bool(scheduling.preemptible) or scheduling.provisioning_model == "SPOT",
            labels=dict(inst.labels),
        )

    # -- shared resources -------------------------------------------------------------------

    def shared_resources(self) -> list[str]:
        return [f"firewall rule {self.grpc_rule}", f"firewall rule {self.ssh_rule}"]

    def _network(self) -> str:
        network = self.gce.network
        return network if "/" in network else f"global/networks/{network}"

    def _firewall_rules(self) -> dict[str, compute_v1.Firewall]:
        ports = self.config.ports
        grpc_ports = sorted({ports.ps, ports.worker, ports.chief})
        return {
            # TensorFlow's gRPC has no authentication: only the cluster's own
            # instances (by network tag) may reach it, never an address range.
            self.grpc_rule: compute_v1.Firewall(
                name=self.grpc_rule,
                description=f"tfcluster {self.config.name}: TensorFlow gRPC between its nodes",
                network=self._network(),
                direction="INGRESS",
                priority=1000,
                allowed=[
                    compute_v1.Allowed(I_p_protocol="tcp", ports=[str(p) for p in grpc_ports])
                ],
                source_tags=[self.network_tag],
                target_tags=[self.network_tag],
            ),
            self.ssh_rule: compute_v1.Firewall(
                name=self.ssh_rule,
                description=f"tfcluster {self.config.name}: SSH from gce.ssh_source_ranges",
                network=self._network(),
                direction="INGRESS",
                priority=1000,
                allowed=[
                    compute_v1.Allowed(I_p_protocol="tcp", ports=[str(self.config.ssh.port)])
                ],
                source_ranges=list(self.gce.ssh_source_ranges),
                target_tags=[self.network_tag],
            ),
        }

    @staticmethod
    def _firewall_shape(rule: compute_v1.Firewall) -> tuple[Any, ...]:
        """What matters of a rule, comparable between ours and the API's."""
        return (
            _last(rule.network),
            rule.direction,
            sorted((a.I_p_protocol, tuple(sorted(a.ports))) for a in rule.allowed),
            sorted(rule.source_ranges),
            sorted(rule.source_tags),
            sorted(rule.target_tags),
            len(rule.denied),
        )

    def _ensure_firewall(self, want: compute_v1.Firewall) -> None:
        current = self._get_firewall(want.name)
        if current is None:
            try:
                op = self._insert_firewall(want)
            except api_exceptions.Conflict:
                current = self._get_firewall(want.name)  # created meanwhile by another run
            else:
                self._wait_operation(op, zone=None, what=f"create firewall rule {want.name}")
                return
        if current is not None and self._firewall_shape(current) != self._firewall_shape(want):
            log.info("updating firewall rule %s to match cluster.yaml", want.name)
            op = self._update_firewall(want)
            self._wait_operation(op, zone=None, what=f"update firewall rule {want.name}")

    def prepare(self) -> None:
        """The SSH key, both firewall rules, and the key and labels on any
        existing node (a lost state folder means a new key: re-install it)."""
        _, public_key = self._key()
        rules = self._firewall_rules()
        with self._api_errors("preparing the cluster"):
            _, errors = self._parallel(lambda name: self._ensure_firewall(rules[name]), list(rules))
            self._raise_errors(errors, "firewall rules")
            self._sync_nodes(self._instances(), public_key)

    def release(self) -> None:
        def delete(name: str) -> None:
            op = self._delete_firewall(name)
            if op is not None:
                self._wait_operation(op, zone=None, what=f"delete firewall rule {name}")

        with self._api_errors("deleting the firewall rules"):
            _, errors = self._parallel(delete, [self.grpc_rule, self.ssh_rule])
            self._raise_errors(errors, "deleting firewall rules")

    def _metadata_items(self, public_key: str) -> dict[str, str]:
        return {
            "ssh-keys": f"{self.config.ssh.user}:{public_key}",
            # OS Login would ignore metadata keys; this cluster logs in with its own.
            "enable-oslogin": "FALSE",
        }

    def _sync_nodes(
        self, instances: Mapping[str, list[compute_v1.Instance]], public_key: str
    ) -> None:
        """Set our labels and metadata keys on the declared nodes that differ."""
        targets = [
            inst for name, found in instances.items() if name in self.config.nodes
            for inst in found
        ]
        wanted_items = self._metadata_items(public_key)

        def sync(key: tuple[str, str]) -> None:
            zone, name = key
            for _ in range(3):  # a concurrent change moves the fingerprint: read again
                inst = self._get_instance(zone, name)
                if inst is None:
                    return
                try:
                    self._sync_one(zone, inst, wanted_items)
                    return
                except api_exceptions.PreconditionFailed:
                    continue
            raise ProviderError(f"{name}: its labels or metadata keep changing; try again")

        keys = [(_last(i.zone), i.name) for i in targets if self._out_of_sync(i, wanted_items)]
        _, errors = self._parallel(sync, keys)
        self._raise_errors(errors, "updating node labels and SSH key")

    def _out_of_sync(self, inst: compute_v1.Instance, items: Mapping[str, str]) -> bool:
        labels = dict(inst.labels)
        current = {i.key: i.value for i in inst.metadata.items}
        return any(labels.get(k) != v for k, v in self._labels(inst.name).items()) or any(
            current.get(k) != v for k, v in items.items()
        )

    def _sync_one(self, zone: str, inst: compute_v1.Instance, items: Mapping[str, str]) -> None:
        want_labels = self._labels(inst.name)
        labels = dict(inst.labels)
        if any(labels.get(k) != v for k, v in want_labels.items()):
            # Other labels (added by hand) stay.
            op = self._set_labels(
                zone, inst.name, {**labels, **want_labels}, inst.label_fingerprint
            )
            self._wait_operation(op, zone=zone, what=f"set the labels of {inst.name}")
        current = {i.key: i.value for i in inst.metadata.items}
        if any(current.get(k) != v for k, v in items.items()):
            merged = {**current, **items}
            metadata = compute_v1.Metadata(
                fingerprint=inst.metadata.fingerprint,
                items=[compute_v1.Items(key=k, value=v) for k, v in merged.items()],
            )
            log.info("installing the cluster's SSH key on %s", inst.name)
            op = self._set_metadata(zone, inst.name, metadata)
            self._wait_operation(op, zone=zone, what=f"set the metadata of {inst.name}")

    # -- creating ------------------------------------------------------------------------

    def _instance_body(self, zone: str, name: str, public_key: str) -> compute_v1.Instance:
        gce = self.gce
        labels = self._labels(name)
        nic = compute_v1.NetworkInterface(
            network=self._network(),
            # An external address: this machine reaches sshd on it.
            access_configs=[
                compute_v1.AccessConfig(
                    name="External NAT", type_="ONE_TO_ONE_NAT", network_tier="PREMIUM"
                )
            ],
        )
        if gce.subnetwork:
            region = zone.rsplit("-", 1)[0]
            nic.subnetwork = (
                gce.subnetwork
                if "/" in gce.subnetwork
                else f"regions/{region}/subnetworks/{gce.subnetwork}"
            )
        scheduling = compute_v1.Scheduling()
        if gce.preemptible:
            scheduling.provisioning_model = "SPOT"
            # STOP, not DELETE: a preempted node keeps its disk; `up` starts it again.
            scheduling.instance_termination_action = "STOP"
            scheduling.automatic_restart = False
            scheduling.on_host_maintenance = "TERMINATE"
        accelerators = []
        if gce.accelerator is not None:
            accelerators = [
                compute_v1.AcceleratorConfig(
                    accelerator_type=(
                        f"projects/{self.api.project}/zones/{zone}/acceleratorTypes/"
                        f"{gce.accelerator.type}"
                    ),
                    accelerator_count=gce.accelerator.count,
                )
            ]
            # GPUs cannot live-migrate: GCE refuses MIGRATE with accelerators.
            scheduling.on_host_maintenance = "TERMINATE"
        return compute_v1.Instance(
            name=name,
            description=f"tfcluster {self.config.name} node {name}",
            machine_type=f"zones/{zone}/machineTypes/{gce.machine_type}",
            labels=labels,
            tags=compute_v1.Tags(items=[self.network_tag]),
            metadata=compute_v1.Metadata(
                items=[
                    compute_v1.Items(key=k, value=v)
                    for k, v in self._metadata_items(public_key).items()
                ]
            ),
            disks=[
                compute_v1.AttachedDisk(
                    boot=True,
                    auto_delete=True,  # `down` leaves no disk to pay for
                    initialize_params=compute_v1.AttachedDiskInitializeParams(
                        source_image=gce.image,
                        disk_size_gb=gce.disk_gb,
                        disk_type=f"zones/{zone}/diskTypes/{gce.disk_type}",
                        labels=labels,
                    ),
                )
            ],
            network_interfaces=[nic],
            scheduling=scheduling,
            guest_accelerators=accelerators,
        )

    def _zone_order(self, existing: Mapping[str, list[compute_v1.Instance]]) -> list[str]:
        """gce.zones, those with most of the cluster's nodes first."""
        counts = Counter(_last(i.zone) for found in existing.values() for i in found)
        zones = list(self.gce.zones)
        return sorted(zones, key=lambda z: (-counts.get(z, 0), zones.index(z)))

    def create_nodes(self, names: Sequence[str]) -> None:
        names = list(dict.fromkeys(names))
        if not names:
            return
        _, public_key = self._key()
        with self._api_errors(f"creating {', '.join(names)}"):
            existing = self._instances()
            present = [n for n in names if n in existing]
            if present:
                # Created meanwhile (another run, or an interrupted one): start, not re-create.
                self._start_existing(present, existing)
            missing = [n for n in names if n not in existing]
            if missing:
                self._create_in_one_zone(missing, public_key, existing)
            self._wait_for(names, NodeState.RUNNING, "start")

    def _create_in_one_zone(
        self,
        names: list[str],
        public_key: str,
        existing: Mapping[str, list[compute_v1.Instance]],
    ) -> str:
        zones = self._zone_order(existing)
        reasons: dict[str, str] = {}
        for index, zone in enumerate(zones):
            log.info("creating %s in %s", ", ".join(names), zone)
            _, errors = self._parallel(
                functools.partial(self._create_one, zone, public_key=public_key), names
            )
            unusable = {n: e for n, e in errors.items() if isinstance(e, _ZoneUnusable)}
            others = {n: e for n, e in errors.items() if n not in unusable}
            if others:
                self._raise_errors(others, f"creating nodes in {zone}")
            if not unusable:
                return zone
            reasons[zone] = "; ".join(dict.fromkeys(str(e) for e in unusable.values()))
            # The batch stays together: what this zone did create goes too.
            self._delete_in_zone(zone, names)
            if index + 1 < len(zones):
                log.warning("zone %s: %s; trying zone %s", zone, reasons[zone], zones[index + 1])
            else:
                # The CapacityError below repeats every zone's reason.
                log.info("zone %s: %s; no zone left to try", zone, reasons[zone])
        raise CapacityError(
            f"no zone could create {', '.join(names)}: "
            + "; ".join(f"{zone}: {reason}" for zone, reason in reasons.items()),
            hint="add zones (another region too) to gce.zones, choose another "
            "gce.machine_type, or ask for more quota; nothing of this attempt was left running",
        )

    def _create_one(self, zone: str, name: str, *, public_key: str) -> None:
        body = self._instance_body(zone, name, public_key)
        try:
            op = self._insert_instance(zone, name, body)
        except api_exceptions.Conflict:
            self._adopt(zone, name)
            return
        except api_exceptions.Forbidden as exc:
            if _is_quota(exc):
                raise _ZoneUnusable(f"QUOTA_EXCEEDED: {_api_message(exc)}") from exc
            raise
        except api_exceptions.NotFound as exc:
            # The machine, disk or GPU type is not offered in this zone.
            if f"zones/{zone}" in _api_message(exc):
                raise _ZoneUnusable(f"not available: {_api_message(exc)}") from exc
            raise
        except api_exceptions.ServiceUnavailable as exc:
            # Only a stockout 503 gets here (others are retried, then a ProviderError).
            raise _ZoneUnusable(_api_message(exc)) from exc
        try:
            self._wait_operation(op, zone=zone, what=f"create {name} in {zone}")
        except _OperationFailed as failed:
            if failed.capacity:
                raise _ZoneUnusable(failed.reason) from failed
            raise

    def _adopt(self, zone: str, name: str) -> None:
        """An instance of this name exists in ``zone`` (409): ours if it has our
        label (a retried insert that had gone through), else refuse."""
        inst = self._get_instance(zone, name)
        if inst is None:
            raise ProviderError(f"{name} in {zone} was reported as existing, then vanished")
        owner = inst.labels.get(CLUSTER_LABEL)
        if owner != self.config.name:
            raise ProviderError(
                f"an instance named {name} already exists in {zone} and is not part of "
                f"cluster {self.config.name} ({CLUSTER_LABEL}={owner or 'unset'})",
                hint="rename the node in cluster.yaml, or delete that instance yourself",
            )
        if _STATES.get(inst.status) in (NodeState.STOPPED, NodeState.STOPPING):
            self._start_one(zone, name)

    def _delete_in_zone(self, zone: str, names: Sequence[str]) -> None:
        """Delete the cluster's instances of ``names`` in ``zone`` (a failed
        batch's successes and half-created leftovers)."""
        leftovers = [i.name for i in self._list_zone(zone) if i.name in names]
        if not leftovers:
            return
        log.info("deleting %s in %s", ", ".join(leftovers), zone)
        _, errors = self._parallel(lambda n: self._delete_one(zone, n), leftovers)
        self._raise_errors(
            errors, f"deleting the half-created nodes in {zone} (run `deploy.py down`)"
        )

    # -- start, stop, delete -------------------------------------------------------------------

    def _start_existing(
        self, names: Sequence[str], existing: Mapping[str, list[compute_v1.Instance]]
    ) -> None:
        def start(name: str) -> None:
            inst = existing[name][0]
            if _STATES.get(inst.status) in (NodeState.STOPPED, NodeState.STOPPING):
                self._start_one(_last(inst.zone), name)

        _, errors = self._parallel(start, list(names))
        self._raise_errors(errors, "starting")

    def _start_one(self, zone: str, name: str) -> None:
        inst = self._get_instance(zone, name)
        if inst is None:
            raise ProviderError(f"{name} disappeared before it could be started")
        if inst.status in ("STOPPING", "SUSPENDING"):
            # GCE refuses to start an instance that is still stopping.
            inst = self._wait_instance(zone, name, {"TERMINATED", "SUSPENDED"})
        if _STATES.get(inst.status) is not NodeState.STOPPED:
            return  # running or on its way
        action = "resume" if inst.status == "SUSPENDED" else "start"
        op = self._instance_action(action, zone, name)
        if op is None:
            raise ProviderError(f"{name} disappeared before it could be started")
        try:
            self._wait_operation(op, zone=zone, what=f"{action} {name} in {zone}")
        except _OperationFailed as failed:
            if failed.capacity:
                # A stopped node's disk lives in its zone: no failover for a start.
                raise CapacityError(
                    f"zone {zone} cannot start {name} now ({failed.reason})",
                    hint="try again later, or `deploy.py down` and `up` to create the "
                    "cluster in another zone",
                ) from failed
            raise

    def _poll_delays(self) -> Iterator[float]:
        """Pauses between two looks at a changing state: quick at first (the
        change is often imminent), growing to ``poll_interval_s``."""
        delay = self.poll_interval_s / 8
        while True:
            yield delay
            delay = min(delay * 1.5, self.poll_interval_s)

    def _wait_instance(self, zone: str, name: str, statuses: set[str]) -> compute_v1.Instance:
        deadline = time.monotonic() + self.gce.operation_timeout
        delays = self._poll_delays()
        while True:
            inst = self._get_instance(zone, name)
            if inst is None:
                raise ProviderError(f"{name} disappeared while waiting for it")
            if inst.status in statuses:
                return inst
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"{name} still {inst.status} after {self.gce.operation_timeout:g} s"
                )
            _pause(next(delays))

    def start_nodes(self, names: Sequence[str]) -> None:
        names = list(dict.fromkeys(names))
        if not names:
            return
        _, public_key = self._key()
        with self._api_errors(f"starting {', '.join(names)}"):
            existing = self._instances()
            missing = [n for n in names if n not in existing]
            if missing:
                raise StateError(
                    f"{', '.join(missing)} does not exist; `deploy.py up` creates it"
                )
            # A node stopped since the key changed would refuse our login.
            self._sync_nodes({n: existing[n] for n in names}, public_key)
            self._start_existing(names, existing)
            self._wait_for(names, NodeState.RUNNING, "start")

    def stop_nodes(self, names: Sequence[str]) -> None:
        names = list(dict.fromkeys(names))
        with self._api_errors(f"stopping {', '.join(names)}"):
            existing = self._instances()
            targets = [
                (_last(inst.zone), inst.name)
                for name in names
                for inst in existing.get(name, [])
                if _STATES.get(inst.status) is not NodeState.STOPPED
            ]

            def stop(target: tuple[str, str]) -> None:
                zone, name = target
                op = self._instance_action("stop", zone, name)
                if op is not None:  # None: deleted meanwhile, which is stopped enough
                    self._wait_operation(op, zone=zone, what=f"stop {name} in {zone}")

            _, errors = self._parallel(stop, targets)
            self._raise_errors(errors, "stopping")

    def terminate_nodes(self, names: Sequence[str]) -> None:
        names = list(dict.fromkeys(names))
        with self._api_errors(f"deleting {', '.join(names)}"):
            existing = self._instances()
            targets = [
                (_last(inst.zone), inst.name) for name in names for inst in existing.get(name, [])
            ]
            _, errors = self._parallel(lambda t: self._delete_one(*t), targets)
            self._raise_errors(errors, "deleting")

    def _delete_one(self, zone: str, name: str) -> None:
        op = self._instance_action("delete", zone, name)
        if op is None:
            return  # already gone
        try:
            self._wait_operation(op, zone=zone, what=f"delete {name} in {zone}")
        except _OperationFailed as failed:
            if "RESOURCE_NOT_FOUND" not in failed.codes:
                raise

    def _wait_for(self, names: Sequence[str], target: NodeState, what: str) -> None:
        """Poll the listing until every named node is in ``target``."""
        timeout = self.gce.operation_timeout
        deadline = time.monotonic() + timeout
        delays = self._poll_delays()
        while True:
            existing = self._instances()
            missing = [n for n in names if n not in existing]
            if missing:
                raise ProviderError(
                    f"{', '.join(missing)} disappeared while waiting for it to {what} "
                    "(deleted by someone, or a failed create)",
                    hint="run `deploy.py up` again",
                )
            status = {n: existing[n][0].status for n in names}
            if target is NodeState.RUNNING:
                stopped = [n for n in names if _STATES.get(status[n]) is NodeState.STOPPED]
                if stopped:
                    raise ProviderError(
                        f"{', '.join(stopped)} stopped while starting (a Spot VM may have "
                        "been preempted)",
                        hint="run `deploy.py up` again",
                    )
            waiting = [n for n in names if _STATES.get(status[n]) is not target]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"not {target.value} after {timeout:g} s: "
                    + ", ".join(f"{n} {status[n]}" for n in waiting),
                    hint="`deploy.py status` shows them; run the command again",
                )
            _pause(next(delays))

    # -- reaching the nodes ------------------------------------------------------------------

    def transport(self, nodes: Sequence[Node]) -> Transport:
        # Imported here: the SSH stack is not needed to list or create nodes.
        from infra.remote import SshTarget, SshTransport

        key_file, _ = self._key()
        unreachable = [n.name for n in nodes if not (n.ssh_host or n.external_ip)]
        if unreachable:
            raise StateError(
                f"{', '.join(unreachable)} has no external IP (not running?); "
                "run `deploy.py up` first"
            )
        targets = [
            SshTarget(n.name, cast(str, n.ssh_host or n.external_ip), n.ssh_port) for n in nodes
        ]
        return SshTransport(targets, config=self.config, state=self.state, key_file=key_file)

    # -- cost ----------------------------------------------------------------------------------

    def hourly_cost(self, nodes: Sequence[Node]) -> float | None:
        """List-price USD/hour (infra/pricing.py): machine, GPUs and external
        IP of running nodes, the boot disk of every node, stopped ones too."""
        total = 0.0
        for node in nodes:
            estimate = pricing.node_hourly(
                node.machine_type,
                running=node.state in (NodeState.RUNNING, NodeState.PENDING),
                spot=node.preemptible,
                accelerators=_parse_accelerators(node.accelerators),
                disk_gb=self.gce.disk_gb,
                disk_type=self.gce.disk_type,
                zone=node.zone,
            )
            for note in estimate.notes:
                if note not in self._unpriced:  # each note once per process
                    self._unpriced.add(note)
                    level = logging.INFO if estimate.usd_per_hour is not None else logging.WARNING
                    log.log(level, "cost estimate: %s", note)
            if estimate.usd_per_hour is None:
                return None
            total += estimate.usd_per_hour
        return total


def _parse_accelerators(text: str | None) -> list[tuple[str, int]]:
    """``"1 x nvidia-tesla-t4, 2 x nvidia-l4"`` (as ``Node.accelerators``) as pairs."""
    out = []
    for part in (text or "").split(","):
        count, sep, gpu = part.strip().partition(" x ")
        if sep and count.isdigit():
            out.append((gpu.strip(), int(count)))
    return out
