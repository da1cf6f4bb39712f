"""The catalog and the TensorFlow side agree: every mode the catalog names
has its ``TrainingMode`` under ``trainer/modes/`` and every mode module
there is named by the catalog; every model has its ``create_task``."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from trainer import catalog, modes
from trainer.distribution import strategy as distribute
from trainer.modes.base import TrainingMode

# Modules of trainer/modes that are no mode: the base class, and --mode
# layers' own pieces (its placement and its pipelined step).
HELPERS = {"base", "placement", "pipeline"}


@pytest.mark.parametrize("name", catalog.MODE_NAMES)
def test_every_catalog_mode_has_its_training_mode(name: str) -> None:
    entry = catalog.mode(name)
    cls = modes.implementation(name)
    assert issubclass(cls, TrainingMode)
    assert entry.module.startswith("trainer.modes.")
    assert entry.strategy in catalog.STRATEGIES


def test_every_mode_module_is_named_by_the_catalog() -> None:
    named = {catalog.mode(name).module for name in catalog.MODE_NAMES}
    found = {
        f"trainer.modes.{info.name}"
        for info in pkgutil.iter_modules(modes.__path__)
        if info.name not in HELPERS
    }
    assert found == named
    # One mode per module: two catalog entries never share an implementation.
    assert len(named) == len(catalog.MODE_NAMES)


@pytest.mark.parametrize("name", catalog.MODELS)
def test_every_catalog_model_has_its_task_factory(name: str) -> None:
    module = importlib.import_module(catalog.model(name).module)
    assert callable(module.create_task)


def test_mode_facts_follow_the_catalog() -> None:
    # The launcher's chief waits for servers exactly where the trainer's
    # ps and workers only serve.
    cluster = {"chief": ("a:1",), "ps": ("b:1",), "worker": ("c:1", "d:1")}
    worker = distribute.ClusterInfo(cluster=cluster, task_type="worker", task_index=0)
    for name in catalog.MODE_NAMES:
        assert distribute.serves_only(worker, name) == catalog.mode(name).workers_serve
    assert [m for m in catalog.MODE_NAMES if not catalog.mode(m).mixed_precision] == [
        "async",
        "ensemble",
        "layers",
    ]
    assert catalog.final_metrics() == (
        ("accuracy", "test_accuracy", "test accuracy"),
        ("psnr", "psnr_reconstructed", "test PSNR"),
    )
