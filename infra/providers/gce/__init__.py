"""Provider ``gce``: the cluster's nodes are Compute Engine instances.

The only package that imports ``google.*``. What exists is what the API
lists with the label ``tfcluster-cluster=<name>`` (across the whole
project, so that nodes in a zone no longer listed in ``gce.zones`` are
still found and deleted) and this state's ``tfcluster-id`` (or none: made
before the id); nothing is remembered locally but the SSH key and the id.
Instances and rules of the name with another id are another person's:
never touched, and ``up`` refuses (``check_owner``).

How it talks to the API:

* ``google-cloud-compute`` clients over REST, at ``gce.api_endpoint`` when
  set (an emulator or the test fake), with ADC, a service-account key file
  or anonymous credentials.
* One retry decorator (``api._retried``) around every call: exponential backoff
  with jitter on 429, 5xx, rate-limit 403s and connection errors, bounded
  in attempts and time. The client library's own retries are switched off
  (``retry=None``) so that there is exactly one policy.
* Mutating calls answer with an Operation; ``api.GceApi._wait_operation`` waits on it
  with our own Zone/GlobalOperationsClient ``wait`` (the client library's
  ``ExtendedOperation.result()`` would poll Google's endpoint whatever the
  configured one), bounded by ``gce.operation_timeout``, and reads its
  ``error`` itself.
* Everything that touches several nodes runs them in parallel threads
  (``parallel.parallel``): four nodes take about as long as one. The threads are
  daemons and stop making calls once the main thread is interrupted, so a
  Ctrl-C returns at once; what was already requested carries the label and
  is found (and deleted) by the next ``up`` or ``down``.

Creation places a batch of new nodes in one zone (TensorFlow's gRPC
traffic between zones is slower and billed): first the zone the cluster's
existing nodes are in, then ``gce.zones`` in order. When a zone is out of
capacity or quota, what the batch created there is deleted and the whole
batch moves to the next zone; when none can take it, ``CapacityError``
lists every zone's reason (``instances.py``).

The modules, one idea each: ``api`` (clients, retries, operations),
``errors`` (API failures read and translated), ``parallel`` (batches and
their cancellation), ``nodes`` (listing, labels, host keys), ``instances``
(create, start, stop, delete), ``body`` (a new instance's disk, network,
scheduling and GPUs, from cluster.yaml alone), ``firewall``, ``project`` (checks that read
the project), ``checks`` (static checks, no API call), ``pricing`` (the
provider's ``Pricing``, from ``price_table``'s dated list prices),
``config`` (cluster.yaml's ``gce`` section, ``GceProvider.config_section``), and
``provider`` (``GceProvider`` composed of them). ``_google`` names the
``google.*`` modules, loaded on the first API call: the registry may import
this package to ask the class what it says from cluster.yaml alone.
"""

from infra.providers.gce.api import RetryPolicy
from infra.providers.gce.firewall import DENY_PRIORITY
from infra.providers.gce.nodes import _STATES, CLUSTER_LABEL, RESERVED_METADATA, ROLE_LABEL
from infra.providers.gce.parallel import _pause
from infra.providers.gce.provider import GceProvider

__all__ = [
    "CLUSTER_LABEL",
    "DENY_PRIORITY",
    "RESERVED_METADATA",
    "ROLE_LABEL",
    "_STATES",
    "GceProvider",
    "RetryPolicy",
    "_pause",
]
