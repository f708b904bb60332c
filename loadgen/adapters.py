"""Spread a workload over LoRA adapters: each request's `model` names one (`--adapters a,b,c`).

    group     (default) one adapter per group (a shared prefix, a document, a session), the groups
              shuffled by the seed and dealt out in turn: an adapter keeps its own prompts, as a
              fine-tuned task keeps its own system prompt; requests without a group go by index
    request   round-robin over the requests by index: every group is asked under every adapter

A request for an adapter is keyed by it (docs/architecture.md#block-keys): with `request` each
group's prefix is cached once per adapter, with `group` once. Nothing else of the workload changes.
"""

from __future__ import annotations

import dataclasses
import random

from kvroute.loadgen.workload_base import RequestSpec, Workload

ASSIGNMENTS = ("group", "request")


def parse_adapters(value: str | None) -> tuple[str, ...]:
    """The names of `--adapters a,b,c` (empty for none); ValueError for an empty or repeated name."""
    if not value:
        return ()
    names = tuple(n.strip() for n in value.split(","))
    if not all(names) or len(set(names)) != len(names):
        raise ValueError(f"--adapters takes distinct comma-separated names, got {value!r}")
    return names


def assign(specs: list[RequestSpec], adapters: tuple[str, ...], how: str = "group", seed: int = 0) -> list[RequestSpec]:
    """`specs` with their `adapter` set (`how`: one of ASSIGNMENTS)."""
    if how not in ASSIGNMENTS:
        raise ValueError(f"--adapter-assign must be one of {', '.join(ASSIGNMENTS)}, got {how!r}")
    if not adapters:
        return specs
    groups = sorted({s.group for s in specs if s.group})
    random.Random(seed).shuffle(groups)
    of_group = {g: adapters[i % len(adapters)] for i, g in enumerate(groups)}
    return [dataclasses.replace(s, adapter=of_group[s.group] if how == "group" and s.group
                                else adapters[s.index % len(adapters)]) for s in specs]


class WithAdapters:
    """A workload whose requests are spread over adapters (`assign`)."""

    def __init__(self, workload: Workload, adapters: tuple[str, ...], how: str = "group", seed: int = 0) -> None:
        self.inner, self.adapters, self.how, self.seed = workload, adapters, how, seed
        self.name = workload.name
        self._specs = assign(workload.requests(), adapters, how, seed)

    def requests(self) -> list[RequestSpec]:
        return self._specs

    def info(self) -> dict:
        return {**self.inner.info(), "adapters": list(self.adapters), "adapter_assign": self.how}


def with_adapters(workload: Workload, adapters: tuple[str, ...], how: str = "group", seed: int = 0) -> Workload:
    return WithAdapters(workload, adapters, how, seed) if adapters else workload


def engine_args(adapters: tuple[str, ...], backend: str, out_dir: str, max_loras: int | None = None,
                engine_args: tuple[str, ...] = ()) -> tuple[str, ...]:
    """`kvroute engine` flags serving `adapters`: bare names for sim engines; for torch engines random PEFT
    adapters written under `out_dir/adapters` for the model `engine_args` name (the tiny one by default).
    `max_loras` defaults to every adapter at once."""
    if not adapters:
        return ()
    slots = ("--max-loras", str(max_loras or len(adapters)))
    if backend == "sim":
        return ("--lora-modules", *adapters, *slots)
    from pathlib import Path

    from kvroute.engine.runners.lora_files import write_random_adapter
    from kvroute.engine.runners.model.config import ModelConfig

    model = next((engine_args[i + 1] for i, a in enumerate(engine_args[:-1]) if a == "--model"), None)
    config = ModelConfig.from_hf_dir(model) if model else ModelConfig.tiny()
    dirs = [write_random_adapter(Path(out_dir) / "adapters" / name, config, seed=i) for i, name in enumerate(adapters)]
    return ("--lora-modules", *(f"{name}={d}" for name, d in zip(adapters, dirs)), *slots)
