"""``--mode sync``: every process runs every step under
MultiWorkerMirroredStrategy, which all-reduces the gradients; the workers'
parameters stay equal (their fingerprints are printed at the end)."""

from __future__ import annotations

from trainer.modes.base import CollectiveMode


class SyncMode(CollectiveMode):
    fingerprint = True


MODE = SyncMode
