"""LoRA adapters applied per row, in a batch of mixed adapters: slots of stacked low-rank weights.

Each adapted projection of each layer (the fused `qkv_proj` and `gate_up_proj`, `o_proj`,
`down_proj`) holds its S slots' (`--max-loras`) adapters stacked: every slot's A matrices in one
(S * n * R, in) matrix and its B matrices, times the adapter's scale and transposed, in one
(S * n * R, out) matrix `Bt`, where n is the PEFT modules fused into the projection (q, k, v: 3)
and R the largest rank loaded. Slot s's module j fills rows [(s * n + j) * R, + its rank); its B
rows reach only module j's columns of the fused output; the rest is zeros, which add nothing.

A step's rows each carry a slot (-1: the base model); with `onehot` (T, S) built once a step:

    y  = x @ W^T                                          the base projection, unchanged
    xa = (x @ A^T).view(T, S, n*R) * onehot[:, :, None]    each row keeps its own slot's columns
    y += xa.view(T, S*n*R) @ Bt                            = scale * x @ A_s^T @ B_s^T, s the row's slot

Three operations per projection whatever the mix of adapters, and no shape depends on it, so a
decode step with adapters is replayed from a CUDA graph like any other. A step without an adapter
row runs none of it; an engine without `--lora-modules` has no slots at all.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from kvroute.engine.runners.lora_config import WEIGHTS_FILE, AdapterSpec, module_shape, tensor_name
from kvroute.engine.runners.model.config import ModelConfig

PROJECTIONS = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
               "down": ("down_proj",)}  # our projection -> the PEFT modules it fuses, in its output's order

Pair = tuple[torch.Tensor, torch.Tensor]  # (A (n*R, in), Bt (n*R, out)) of one slot or of all of them


def _layout(config: ModelConfig, proj: str) -> tuple[int, int, list[tuple[int, int]]]:
    """(in, out, each module's (column offset, width) in the fused output)."""
    mods = PROJECTIONS[proj]
    widths = [module_shape(config, m)[0] for m in mods]
    offsets = [sum(widths[:j]) for j in range(len(mods))]
    return module_shape(config, mods[0])[1], sum(widths), list(zip(offsets, widths))


def read_adapter_tensors(spec: AdapterSpec, config: ModelConfig, rank: int,
                         dtype: torch.dtype) -> list[dict[str, Pair]]:
    """One slot's blocks of `spec` per layer and projection: A (n*rank, in), scale * B^T (n*rank, out)."""
    from safetensors import safe_open

    path = f"{spec.path}/{WEIGHTS_FILE}"
    wanted = {tensor_name(i, m, w) for i in range(config.num_layers) for m in spec.targets
              for w in ("lora_A", "lora_B")}
    with safe_open(path, framework="pt") as f:
        names = set(f.keys())
        extra = sorted(names - wanted)
        if extra:
            raise ValueError(f"LoRA adapter {spec.name!r}: {path} has tensor {extra[0]}, which is not a "
                             f"lora_A/lora_B of its target_modules in this model's {config.num_layers} layers")
        layers = []
        for i in range(config.num_layers):
            layers.append({p: _block(f, spec, config, i, p, rank, dtype) for p in PROJECTIONS})
    return layers


def _block(f, spec: AdapterSpec, config: ModelConfig, layer: int, proj: str, rank: int, dtype: torch.dtype) -> Pair:
    fan_in, fan_out, columns = _layout(config, proj)
    n = len(PROJECTIONS[proj])
    a, bt = torch.zeros(n * rank, fan_in), torch.zeros(n * rank, fan_out)
    for j, (module, (offset, width)) in enumerate(zip(PROJECTIONS[proj], columns)):
        if module not in spec.targets:
            continue
        names = tensor_name(layer, module, "lora_A"), tensor_name(layer, module, "lora_B")
        try:
            la, lb = f.get_tensor(names[0]).float(), f.get_tensor(names[1]).float()
        except Exception:  # safetensors raises its own error type for a missing name
            raise ValueError(f"LoRA adapter {spec.name!r}: {spec.path}/{WEIGHTS_FILE} lacks {names[0]} or "
                             f"{names[1]}") from None
        if tuple(la.shape) != (spec.rank, fan_in) or tuple(lb.shape) != (width, spec.rank):
            raise ValueError(f"LoRA adapter {spec.name!r}: {names[0]} is {tuple(la.shape)} and lora_B "
                             f"{tuple(lb.shape)}; this model needs ({spec.rank}, {fan_in}) and ({width}, {spec.rank})")
        a[j * rank:j * rank + spec.rank] = la
        bt[j * rank:j * rank + spec.rank, offset:offset + width] = lb.T * spec.scale
    return a.to(dtype), bt.to(dtype)


@dataclasses.dataclass(slots=True)
class StepLora:
    """One step's adapters: every layer's stacked weights and the rows' slots, one-hot (T, S)."""

    layers: list[dict[str, Pair]]
    onehot: torch.Tensor

    def add(self, layer: int, proj: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y (T, out) plus each row's adapter update of this projection of x (T, in)."""
        a, bt = self.layers[layer][proj]
        t, s = self.onehot.shape
        xa = F.linear(x, a).view(t, s, -1).mul_(self.onehot[:, :, None])  # (T, S, n*R)
        return torch.addmm(y, xa.view(t, -1), bt)


class LoraWeights:
    """The device's adapter slots, each filled from an adapter's host copy when the scheduler gives it one."""

    def __init__(self, config: ModelConfig, adapters: tuple[AdapterSpec, ...], num_slots: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.config, self.num_slots, self.device = config, num_slots, device
        self.rank = max(a.rank for a in adapters)
        self.host = {a.name: self._pin(read_adapter_tensors(a, config, self.rank, dtype)) for a in adapters}
        self.layers: list[dict[str, Pair]] = []
        for _ in range(config.num_layers):
            layer = {}
            for proj, mods in PROJECTIONS.items():
                fan_in, fan_out, _ = _layout(config, proj)
                rows = num_slots * len(mods) * self.rank
                layer[proj] = (torch.zeros(rows, fan_in, dtype=dtype, device=device),
                               torch.zeros(rows, fan_out, dtype=dtype, device=device))
            self.layers.append(layer)
        self.slots: list[str | None] = [None] * num_slots  # what each slot holds now
        self.slot_ids = torch.arange(num_slots, device=device)
        self.loads = 0

    def _pin(self, layers: list[dict[str, Pair]]) -> list[dict[str, Pair]]:
        if self.device.type != "cuda":
            return layers
        return [{p: (a.pin_memory(), bt.pin_memory()) for p, (a, bt) in layer.items()} for layer in layers]

    def ensure(self, slot: int, name: str) -> bool:
        """Make `slot` hold adapter `name` (copied in, queued on the device); True if it had to be loaded."""
        if self.slots[slot] == name:
            return False
        host = self.host[name]
        for layer, blocks in zip(self.layers, host):
            for proj, (a, bt) in blocks.items():
                rows = slice(slot * a.shape[0], (slot + 1) * a.shape[0])
                layer[proj][0][rows].copy_(a, non_blocking=True)
                layer[proj][1][rows].copy_(bt, non_blocking=True)
        self.slots[slot] = name
        self.loads += 1
        return True

    def step(self, rows: torch.Tensor, dtype: torch.dtype) -> StepLora:
        """`rows` (T,) long: each row's slot, -1 for none."""
        return StepLora(self.layers, (rows[:, None] == self.slot_ids[None, :]).to(dtype))
