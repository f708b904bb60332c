"""kvroute: a KV-cache-aware router for LLM serving fleets, with the engines, load generator and
simulator to prove it.

One import name for the three programs: `kvroute.router` (never imports torch), `kvroute.engine`
and `kvroute.loadgen`. In the repository they are the top-level folders `router/`, `engine/` and
`loadgen/` (docs/architecture.md#layout); `kvroute/router` and its siblings are links to them, so
a checkout imports as an installed wheel does. Entry points: `kvroute.main(argv)` is the `kvroute`
command (`python -m kvroute`), `kvroute.block_hashes` the block-hash chain every part shares.
Nothing heavy is imported until it is used.
"""

from __future__ import annotations

from importlib import metadata as _metadata
from typing import Any

try:
    __version__ = _metadata.version("kvroute")
except _metadata.PackageNotFoundError:  # a checkout that was never installed
    __version__ = "0+unknown"

_LAZY = {
    "main": ("kvroute.cli", "main"),
    "block_hashes": ("kvroute.router.contract.protocol", "block_hashes"),
    "hash_seed": ("kvroute.router.contract.protocol", "hash_seed"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'kvroute' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    return getattr(importlib.import_module(module), attr)
