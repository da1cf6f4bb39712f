"""Cloud Storage as the nodes use it: ``gs://`` URLs (``urls.py``), transfers
(``transfer.py``; ``_gcs.py`` loads Google's module on first use) and the
uploader that mirrors a run folder into the bucket (``uploader.py``,
``python -m infra.storage.uploader``).

This folder is shipped to the nodes with the code (``CODE_PATHS`` in
infra/setup/sync.py), so it imports only the standard library,
google-cloud-storage and itself. This machine's side of the bucket (the
client, the check, runs) is ``infra/bucket/``; cluster.yaml's ``storage``
section is ``infra/config/storage.py``.
"""
