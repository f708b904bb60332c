"""PEFT-format LoRA adapters of random weights, written on the fly (tests, `kvroute bench --adapters`).

What PEFT's `save_pretrained` writes for a Llama-family model: `adapter_config.json` and
`adapter_model.safetensors` with `base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_A.weight`
(r, in) and `...lora_B.weight` (out, r). Unlike a fresh PEFT adapter (B zero), both matrices are
random, so the adapter changes the model's outputs. numpy only: nothing here needs torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kvroute.engine.runners.lora_config import CONFIG_FILE, TARGETS, WEIGHTS_FILE, module_shape, tensor_name
from kvroute.engine.runners.model.config import ModelConfig


def write_random_adapter(path: str | Path, config: ModelConfig, *, rank: int = 8, alpha: float = 16.0,
                         targets: tuple[str, ...] = TARGETS, seed: int = 0, std: float = 0.05,
                         extra_config: dict | None = None) -> Path:
    """An adapter for `config` at `path` (created): normal(0, std) A and B for every layer and target."""
    from safetensors.numpy import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(config.num_layers):
        for module in targets:
            rows, cols = module_shape(config, module)
            tensors[tensor_name(layer, module, "lora_A")] = (rng.standard_normal((rank, cols)) * std).astype(np.float32)
            tensors[tensor_name(layer, module, "lora_B")] = (rng.standard_normal((rows, rank)) * std).astype(np.float32)
    save_file(tensors, str(out / WEIGHTS_FILE))
    peft = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": config.name, "r": rank,
            "lora_alpha": alpha, "lora_dropout": 0.0, "bias": "none", "target_modules": list(targets),
            "use_rslora": False, "use_dora": False, "modules_to_save": None, **(extra_config or {})}
    (out / CONFIG_FILE).write_text(json.dumps(peft, indent=2))
    return out
