"""LoRA adapters as `kvroute engine --lora-modules NAME=DIR` names them, in PEFT's format.

A directory holds `adapter_config.json` (PEFT's `LoraConfig`) and `adapter_model.safetensors`
(PEFT's tensor names, `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`, shape
(r, in), and `...lora_B.weight`, shape (out, r)). What kvroute applies, and refuses otherwise:

    peft_type        LORA
    r, lora_alpha    rank 1..--max-lora-rank; scale lora_alpha / r (lora_alpha / sqrt(r) with use_rslora)
    target_modules   a list among q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj,
                     one of those names, or "all-linear" (all seven); no regular expression
    refused          use_dora, bias other than "none", modules_to_save, fan_in_fan_out,
                     layers_to_transform, rank_pattern and alpha_pattern (per-layer ranks), lora_bias,
                     exclude_modules, layer_replication, target_parameters, trainable_token_indices, and
                     PEFT 0.21's variants (alora_invocation_tokens, arrow_config, use_qalora, use_bdlora,
                     kasa_config): any of them set (PEFT writes each as null, false or empty when unused)

Reading a config needs no torch: the CLI checks every adapter this way before the port is bound
(engine/runners/model/lora.py loads the tensors). The sim backend has no weights: it takes a bare
NAME as well, and reads a DIR's config only when one is given.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable
from pathlib import Path

from kvroute.engine.runners.model.config import ModelConfig

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model.model.layers"


def module_shape(config: ModelConfig, module: str) -> tuple[int, int]:
    """(out, in) of one of the adapted projections."""
    h, q, kv, inter = (config.hidden_size, config.num_heads * config.head_dim,
                       config.num_kv_heads * config.head_dim, config.intermediate_size)
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}[module]


def tensor_name(layer: int, module: str, which: str) -> str:
    """PEFT's name of a layer's `lora_A` or `lora_B` weight."""
    block = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
    return f"{PEFT_PREFIX}.{layer}.{block}.{module}.{which}.weight"


_REFUSED = {"use_dora": "DoRA (use_dora)", "modules_to_save": "modules_to_save", "fan_in_fan_out": "fan_in_fan_out",
            "layers_to_transform": "layers_to_transform", "rank_pattern": "per-module ranks (rank_pattern)",
            "alpha_pattern": "per-module alphas (alpha_pattern)", "lora_bias": "a bias on lora_B (lora_bias)",
            "exclude_modules": "exclude_modules", "layer_replication": "layer_replication",
            "target_parameters": "target_parameters", "trainable_token_indices": "trainable_token_indices",
            # PEFT variants that change what the adapter computes at inference (PEFT 0.21's names)
            "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)", "arrow_config": "arrow_config",
            "use_qalora": "QA-LoRA (use_qalora)", "use_bdlora": "use_bdlora", "kasa_config": "kasa_config"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdapterSpec:
    """One adapter: the name requests give as `model`, its directory, rank, scale and target modules."""

    name: str
    path: str
    rank: int = 0  # 0: not read (a sim engine's adapter named without a directory)
    scale: float = 1.0
    targets: tuple[str, ...] = ()


def parse_lora_modules(values: Iterable[str], base_model: str = "",
                       dirs: bool = True) -> tuple[tuple[str, str], ...]:
    """("NAME", "DIR") pairs from NAME=DIR strings (a bare NAME too unless `dirs`: its DIR is "");
    ValueError naming the bad one."""
    out: list[tuple[str, str]] = []
    for value in values:
        name, sep, path = value.partition("=")
        name, path = name.strip(), path.strip()
        if not name or (sep or dirs) and not path:
            raise ValueError(f"--lora-modules takes NAME=DIR{'' if dirs else ' or NAME'}, got {value!r}")
        if any(name == seen for seen, _ in out):
            raise ValueError(f"--lora-modules names {name!r} twice")
        if base_model and name == base_model:
            raise ValueError(f"--lora-modules name {name!r} is the base model's; give the adapter another name")
        out.append((name, path))
    return tuple(out)


def read_adapter(name: str, path: str, max_rank: int) -> AdapterSpec:
    """The adapter at `path`, its config checked (ValueError with what is wrong and where)."""
    folder = Path(path)
    config_file, weights = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config_file.is_file():
        raise ValueError(f"LoRA adapter {name!r}: no {CONFIG_FILE} in {path}")
    if not weights.is_file():
        raise ValueError(f"LoRA adapter {name!r}: no {WEIGHTS_FILE} in {path} (.bin adapters are not supported)")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"LoRA adapter {name!r}: {config_file} is not JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"LoRA adapter {name!r}: {config_file} is not a JSON object")
    try:
        return _spec(name, path, config, max_rank)
    except ValueError as e:
        raise ValueError(f"LoRA adapter {name!r} ({config_file}): {e}") from None


def _spec(name: str, path: str, config: dict, max_rank: int) -> AdapterSpec:
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ValueError(f"peft_type {config.get('peft_type')!r} is not LORA")
    refused = [what for key, what in _REFUSED.items() if config.get(key)]
    if config.get("bias", "none") != "none":
        refused.append(f"bias {config['bias']!r}")
    if refused:
        raise ValueError(f"{', '.join(refused)} not supported")
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= max_rank:
        raise ValueError(f"rank r must be an integer from 1 to --max-lora-rank ({max_rank}), got {rank!r}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
        raise ValueError(f"lora_alpha must be a positive number, got {alpha!r}")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return AdapterSpec(name=name, path=path, rank=rank, scale=float(scale),
                       targets=_targets(config.get("target_modules")))


def _targets(value) -> tuple[str, ...]:
    if value == "all-linear":
        return TARGETS
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"target_modules must name modules among {', '.join(TARGETS)}, got {value!r}")
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        raise ValueError(f"target module {unknown[0]!r} cannot be adapted; kvroute applies LoRA to "
                         f"{', '.join(TARGETS)} (a regular expression is not supported)")
    return tuple(t for t in TARGETS if t in names)


def read_adapters(modules: Iterable[tuple[str, str]], max_rank: int) -> tuple[AdapterSpec, ...]:
    """Each adapter's spec; one named without a directory (sim backend) is not read."""
    return tuple(read_adapter(name, path, max_rank) if path else AdapterSpec(name=name, path="")
                 for name, path in modules)
