"""Where a benchmark's figures go: the JSON file named by its --out (nothing without one)."""

from __future__ import annotations

import json
import pathlib
from typing import Any


def write_json(path: str | None, result: Any) -> None:
    if path:
        pathlib.Path(path).write_text(json.dumps(result, indent=2) + "\n")
