"""Workload registry: name -> workload class; each class is a factory taking (config, seed).

    make_workload("shared-prefix", seed=1, groups=4, prefix_tokens=512)
    make_workload("trace:/path/to/trace.jsonl", num_requests=100, trace_block_tokens=16)

Each workload module holds one frozen config dataclass (its knobs, with defaults,
validated in __post_init__) and one class with `requests()` and `info()`. The CLI
flags are the config fields (`--prefix-tokens` -> prefix_tokens). Everything here
is pure and synchronous: the cluster simulator uses it too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvroute.loadgen.workload_base import Workload
from kvroute.loadgen.workloads.doc_qa import DocQAConfig, DocQAWorkload
from kvroute.loadgen.workloads.knobs import knob_settings
from kvroute.loadgen.workloads.multi_turn import MultiTurnConfig, MultiTurnWorkload
from kvroute.loadgen.workloads.no_sharing import RandomConfig, RandomWorkload
from kvroute.loadgen.workloads.session_storm import SessionStormConfig, SessionStormWorkload
from kvroute.loadgen.workloads.shared_prefix import SharedPrefixConfig, SharedPrefixWorkload
from kvroute.loadgen.workloads.shifting import ShiftConfig, ShiftWorkload
from kvroute.loadgen.workloads.trace import TraceConfig, TraceWorkload
from kvroute.router.contract.settings import did_you_mean

WORKLOADS: dict[str, Any] = {
    "shared-prefix": SharedPrefixWorkload,
    "multi-turn": MultiTurnWorkload,
    "doc-qa": DocQAWorkload,
    "random": RandomWorkload,
    "shift": ShiftWorkload,
    "session-storm": SessionStormWorkload,
    "trace": TraceWorkload,
}
CONFIGS: dict[str, type] = {
    "shared-prefix": SharedPrefixConfig,
    "multi-turn": MultiTurnConfig,
    "doc-qa": DocQAConfig,
    "random": RandomConfig,
    "shift": ShiftConfig,
    "session-storm": SessionStormConfig,
    "trace": TraceConfig,
}
TRACE_PREFIX = "trace:"


def workload_names() -> str:
    return ", ".join(n if n != "trace" else "trace:FILE" for n in WORKLOADS)


def split_name(name: str) -> tuple[str, dict]:
    """("trace", {"path": FILE}) for "trace:FILE"; (name, {}) otherwise; ValueError if unknown."""
    if name.startswith(TRACE_PREFIX):
        return "trace", {"path": name[len(TRACE_PREFIX):]}
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}{did_you_mean(name, WORKLOADS)}; choose from {workload_names()}")
    return name, {}


def knob_names(name: str) -> list[str]:
    """The config fields (knobs) of a workload, e.g. ['num_requests', 'groups', ...]."""
    base, _ = split_name(name)
    return [f.name for f in dataclasses.fields(CONFIGS[base]) if f.name != "path"]


def knob_flags() -> list:
    """Every workload's knobs as flags (loadgen/workloads/knobs.py)."""
    return knob_settings(CONFIGS)


def make_config(name: str, **knobs: Any):
    base, fixed = split_name(name)
    allowed = knob_names(base)
    unknown = sorted(set(knobs) - set(allowed))
    if unknown:
        raise ValueError(f"workload {base} has no knob {unknown[0]!r}; its knobs: {', '.join(allowed)}")
    return CONFIGS[base](**fixed, **knobs)


def make_workload(name: str, seed: int = 0, **knobs: Any) -> Workload:
    """Build a workload by name; ValueError with a user-facing sentence for bad names or knobs."""
    config = make_config(name, **knobs)
    base, _ = split_name(name)
    return WORKLOADS[base](config, seed)


__all__ = ["WORKLOADS", "CONFIGS", "make_workload", "make_config", "knob_flags", "knob_names", "split_name",
           "workload_names"]
