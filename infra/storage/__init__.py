"""The cluster's bucket in Cloud Storage: where runs live once a job ends.

This package owns everything tfcluster does with Cloud Storage, on both
sides:

* on this machine: cluster.yaml's ``storage`` section (``config.py``), the
  ``gs://`` URLs and the names GCS accepts (``urls.py``), the client
  (``client.py``; ``_gcs.py`` loads Google's module on first use), the
  check ``up`` makes before it creates anything (``check.py``), and what
  ``fetch``, ``runs``, ``report`` and ``--resume`` read from the bucket
  (``runs.py``);
* on the nodes: ``uploader.py``, the uploader that mirrors a job's run folder
  into the bucket with the node's own credentials, started beside the
  chief as a task of its own, and its ``restore``/``data`` commands
  (``python -m infra.storage.uploader``). The nodes get only what it imports
  (``urls``, ``_gcs``, ``transfer``: the standard library and
  google-cloud-storage), shipped with the code (``CODE_PATHS`` in
  infra/sync.py).

Only this package imports ``google.cloud.storage``, lazily. This file
imports nothing: the nodes import the package without pydantic.
"""
