"""Model runner registry: `--backend` name -> factory. Torch is imported only when used."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from kvroute.engine.core.config import BatchConfig
from kvroute.engine.core.work import ModelRunner
from kvroute.engine.kv.config import TierConfig
from kvroute.engine.runners.config import BACKENDS, RunnerConfig
from kvroute.engine.runners.cost_model import get_cost_model
from kvroute.engine.runners.model.config import ModelConfig


def model_config(runner: RunnerConfig) -> ModelConfig:
    mc = ModelConfig.from_hf_dir(runner.model) if runner.model else ModelConfig.tiny()
    return dataclasses.replace(mc, dtype=runner.dtype) if runner.dtype else mc


def _torch(runner: RunnerConfig, batch: BatchConfig, tiers: TierConfig) -> ModelRunner:
    from kvroute.engine.runners.lora_config import read_adapters
    from kvroute.engine.runners.torch_runner import TorchRunner

    return TorchRunner(model_config(runner), batch.num_blocks, batch.block_size, model_dir=runner.model,
                       device=runner.device, num_threads=runner.num_threads, seed=runner.seed,
                       host_blocks=tiers.host_blocks, max_running=batch.max_running, cuda_graphs=runner.cuda_graphs,
                       adapters=read_adapters(runner.adapter_dirs, runner.max_lora_rank), max_loras=runner.max_loras)


def _sim(runner: RunnerConfig, batch: BatchConfig, tiers: TierConfig) -> ModelRunner:
    from kvroute.engine.runners.sim import SimRunner

    info = model_config(runner).runner_info()
    from kvroute.engine.kv.tier_setup import host_link_name, store_link_name

    return SimRunner(get_cost_model(runner.cost_model), info, seed=runner.seed, time_scale=runner.time_scale,
                     block_size=batch.block_size, link=runner.kv_link, host_link=host_link_name(tiers, runner.device),
                     store_link=store_link_name(tiers))


# A runner from its own section, the pool's sizes (batch) and the tiers' (a host pool, the sim's links).
RUNNERS: dict[str, Callable[[RunnerConfig, BatchConfig, TierConfig], ModelRunner]] = {"torch": _torch, "sim": _sim}
assert tuple(RUNNERS) == BACKENDS  # the --backend choices
