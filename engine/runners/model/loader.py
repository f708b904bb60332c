"""Weights for `Llama`: seeded random ones for a config, or a local HF safetensors checkpoint.

Our module fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj`; HF names map as
`model.layers.N.self_attn.{q,k,v}_proj.*` -> `layers.N.self_attn.qkv_proj.*` (concatenated
in that order), `model.layers.N.mlp.{gate,up}_proj.*` -> `layers.N.mlp.gate_up_proj.*`,
everything else by dropping the `model.` prefix. `lm_head` is the embedding when tied.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from kvroute.engine.runners.model.config import ModelConfig
from kvroute.engine.runners.model.kv_pool import DTYPES
from kvroute.engine.runners.model.llama import Llama

INIT_STD = 0.02
_FUSED = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "mlp.gate_up_proj": ("gate_proj", "up_proj")}


def build_model(config: ModelConfig, model_dir: str | Path | None = None,
                device: torch.device | str = "cpu", seed: int = 0) -> Llama:
    """A ready-to-run model in eval mode; random weights from `seed` when no `model_dir`."""
    model = Llama(config, device=device)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if model_dir is None:
        state = random_state_dict(shapes, seed)
    else:
        state = hf_state_dict(config, Path(model_dir), shapes)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    dtype = DTYPES[config.dtype]
    state = {name: t.to(device=device, dtype=dtype) for name, t in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def random_state_dict(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    """Normal(0, 0.02) matrices, ones for norms, zeros for biases; same seed, same weights."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in sorted(shapes.items()):
        if name.endswith("norm.weight"):
            state[name] = torch.ones(shape)
        elif name.endswith(".bias"):
            state[name] = torch.zeros(shape)
        else:
            state[name] = torch.randn(shape, generator=gen) * INIT_STD
    return state


def hf_state_dict(config: ModelConfig, model_dir: Path,
                  shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    where = _tensor_files(model_dir)
    state = {}
    with contextlib.ExitStack() as stack:
        files = {f: stack.enter_context(safe_open(f, framework="pt")) for f in set(where.values())}
        for name, shape in shapes.items():
            if name == "lm_head.weight" and config.tie_word_embeddings:
                continue
            parts = [_hf_name(part) for part in _fused_parts(name)]
            missing = [p for p in parts if p not in where]
            if missing:
                raise ValueError(f"checkpoint in {model_dir} lacks tensor {missing[0]}")
            tensors = [files[where[part]].get_tensor(part) for part in parts]
            tensor = torch.cat(tensors, dim=0) if len(tensors) > 1 else tensors[0]
            if tuple(tensor.shape) != shape:
                raise ValueError(
                    f"tensor {parts[0]} has shape {tuple(tensor.shape)}, the config implies {shape}")
            state[name] = tensor
    return state


def _fused_parts(name: str) -> list[str]:
    for fused, parts in _FUSED.items():
        if f".{fused}." in name:
            return [name.replace(fused, f"{fused.split('.')[0]}.{part}") for part in parts]
    return [name]


def _hf_name(part: str) -> str:
    return part if part.startswith("lm_head.") else f"model.{part}"


def _tensor_files(model_dir: Path) -> dict[str, str]:
    """HF tensor name -> the safetensors file holding it (sharded or single file)."""
    if not model_dir.is_dir():
        raise ValueError(f"model directory {model_dir} does not exist")
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
        for file in files:
            if not (model_dir / file).is_file():
                raise ValueError(f"shard {file} listed in {index.name} is missing from {model_dir}")
        return {name: str(model_dir / file) for name, file in weight_map.items()}
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {model_dir} (.bin checkpoints are not supported)")
    from safetensors import safe_open

    where = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            where.update({name: str(file) for name in f.keys()})
    return where
