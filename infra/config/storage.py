"""cluster.yaml's ``storage`` section: the cluster's bucket.

    storage:
      bucket: gs://my-bucket/tfcluster     # runs land in <prefix>/<cluster>/<run id>/
      endpoint: http://127.0.0.1:9023      # an emulator or a test fake (default Google's;
                                           # also $STORAGE_EMULATOR_HOST)
      credentials: adc                     # adc | anonymous | a service-account key file

Left out, nothing uses a bucket (every provider works without one). Any
provider may use one: a local or ssh cluster's nodes upload with
``credentials``, a GCE cluster's with its service account.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from pydantic import field_validator

from infra.config.base import Strict, show
from infra.storage.urls import GsUrl, parse_gs_url

# The emulator convention of Google's clients (python-storage reads it too).
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


class StorageConfig(Strict):
    """Where the cluster's runs live in Cloud Storage."""

    # gs://BUCKET or gs://BUCKET/PREFIX: runs go to PREFIX/<cluster>/<run id>/.
    bucket: str
    # The Cloud Storage endpoint; None = $STORAGE_EMULATOR_HOST, else Google's.
    endpoint: str | None = None
    # "adc" (application default credentials; on GCE nodes the metadata
    # server), "anonymous" (emulators only), or the path of a
    # service-account JSON key file (sent to ssh nodes, never synced).
    credentials: str = "adc"

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, bucket: str) -> str:
        parse_gs_url(bucket)  # ValueError: one line naming what is wrong
        return bucket

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, endpoint: str | None) -> str | None:
        if endpoint is not None and not re.match(r"^https?://[^/]+", endpoint):
            raise ValueError(f"{show(endpoint)} is not a URL such as http://127.0.0.1:9023")
        return endpoint.rstrip("/") if endpoint else endpoint

    @property
    def url(self) -> GsUrl:
        return parse_gs_url(self.bucket)

    def api_endpoint(self) -> str | None:
        """The endpoint to talk to: this section's, else the emulator
        variable's (with http:// when it names only host:port), else None
        (Google's)."""
        if self.endpoint:
            return self.endpoint
        host = os.environ.get(EMULATOR_ENV, "").strip()
        if not host:
            return None
        return host if "://" in host else f"http://{host}"

    def run_url(self, cluster: str, run_id: str) -> GsUrl:
        """The folder of one run: gs://BUCKET/PREFIX/<cluster>/<run id>."""
        return self.url.child(cluster, run_id)

    def cluster_url(self, cluster: str) -> GsUrl:
        return self.url.child(cluster)


@dataclass(frozen=True)
class NodeIdentity:
    """Who the nodes write to the bucket as, where it is an identity of
    their own rather than ``storage.credentials`` (a GCE node's service
    account); ``default_account``: GCE's default compute account, an
    editor of ``project``."""

    email: str
    project: str | None = None
    default_account: bool = False
