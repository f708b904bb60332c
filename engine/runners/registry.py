"""Model runner registry: `--backend` name -> factory. Torch is imported only when used."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvroute.engine.core.work import ModelRunner, RunnerInfo
from kvroute.engine.runners.cost_model import get_cost_model
from kvroute.engine.runners.model.config import ModelConfig

if TYPE_CHECKING:  # the engine's config sits above its parts: they read its fields, and name it only here
    from kvroute.engine.config import EngineConfig


def model_config(config: EngineConfig) -> ModelConfig:
    mc = ModelConfig.from_hf_dir(config.model) if config.model else ModelConfig.tiny()
    return dataclasses.replace(mc, dtype=config.dtype) if config.dtype else mc


def _torch(config: EngineConfig) -> ModelRunner:
    from kvroute.engine.runners.torch_runner import TorchRunner

    return TorchRunner(model_config(config), config.num_blocks, config.block_size, model_dir=config.model,
                       device=config.device, num_threads=config.num_threads, seed=config.seed,
                       host_blocks=config.host_blocks, max_running=config.max_running, cuda_graphs=config.cuda_graphs)


def _sim(config: EngineConfig) -> ModelRunner:
    from kvroute.engine.runners.sim import SimRunner

    mc = model_config(config)
    info = RunnerInfo(model=mc.name, vocab_size=mc.vocab_size, max_model_len=mc.max_position_embeddings,
                      eos_token_id=mc.eos_token_id, dtype=mc.dtype, num_layers=mc.num_layers,
                      num_kv_heads=mc.num_kv_heads, head_dim=mc.head_dim)
    from kvroute.engine.kv.tier_setup import host_link_name, store_link_name

    return SimRunner(get_cost_model(config.cost_model), info, seed=config.seed, time_scale=config.time_scale,
                     block_size=config.block_size, link=config.kv_link, host_link=host_link_name(config),
                     store_link=store_link_name(config))


RUNNERS: dict[str, Callable[[EngineConfig], ModelRunner]] = {"torch": _torch, "sim": _sim}
