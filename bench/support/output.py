"""How a benchmark ends: its table for people (unless ``--json-only``),
then its report as JSON, on one line with ``--json-only`` (what the smoke
tests and scripts read: the last line), and into ``--json-out`` if given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(
    report: Any, table: str | None, *, json_only: bool, json_out: Path | None = None
) -> None:
    if not json_only and table is not None:
        print(table)
    text = json.dumps(report, indent=None if json_only else 2)
    print(text)
    if json_out is not None:
        json_out.write_text(text + "\n")
