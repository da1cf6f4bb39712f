"""What every section of cluster.yaml is built from: ``Strict`` (the base
of each section's pydantic model), ``Port`` and ``show`` (a value as an
error line quotes it).

Apart from infra/config/schema.py so that a provider's own section (the
gce package's ``GceConfig``, a plug-in's) is built the same way without
importing the whole schema.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

Port = Annotated[int, Field(ge=1024, le=65535)]


def show(value: object, limit: int = 60) -> str:
    """``value`` for an error line: its repr, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Strict(BaseModel):
    # Unknown keys are errors: a typo must never silently fall back to a
    # default that provisions something else (and costs money).
    # strict: `steps: true` is not 1, `steps: "10"` is not 10 (YAML has
    # real numbers and booleans); no .inf or .nan where a number goes.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
