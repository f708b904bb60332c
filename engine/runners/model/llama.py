"""A Llama-family forward over a paged K/V pool, in one file.

One call runs a step: the new tokens of several sequences, flattened into T rows. Rows of
decode sequences (one new token each) come first, then each prefill chunk as a contiguous
run of rows. Every layer writes the new K/V into the pool, then attends over each
sequence's whole context read back from the pool (engine/runners/model/attention.py).
What every layer shares -- rotary tables, the decode key mask, the chunks' masks -- is built
once per step, so a layer is a fixed, short list of operations whatever the batch.

Logits are computed only for the rows listed in `StepBatch.logits_rows`.
Shapes: T new tokens, H hidden, nh/kvh query/KV heads, hd head dim, B decode sequences,
L context length (padded to whole blocks), V vocab.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from kvroute.engine.runners.model import attention
from kvroute.engine.runners.model.attention import ChunkMask
from kvroute.engine.runners.model.config import ModelConfig
from kvroute.engine.runners.model.kv_pool import GatherSpace, KVPool
from kvroute.engine.runners.model.lora import LoraWeights, StepLora


@dataclasses.dataclass(slots=True)
class DecodeGroup:
    num_seqs: int  # rows [0, num_seqs) of the step
    block_ids: torch.Tensor  # (B * nblk,) long: each sequence's nblk context blocks, padded with the scratch block
    context_lens: torch.Tensor  # (B,) long
    key_mask: torch.Tensor | None = None  # (B, 1, 1, nblk * bs) bool, key position < context_len: set per step


@dataclasses.dataclass(slots=True)
class PrefillChunk:
    row_start: int  # rows [row_start, row_start + num_new) of the step
    num_new: int
    start_pos: int  # positions < start_pos are read from the pool
    block_ids: torch.Tensor | None  # (ceil(context / bs),) long; None when start_pos == 0
    mask: ChunkMask | None = None  # the masked path's mask: set per step


@dataclasses.dataclass(slots=True)
class StepBatch:
    input_ids: torch.Tensor  # (T,) long
    positions: torch.Tensor  # (T,) long
    slot_blocks: torch.Tensor  # (T,) long, pool block of each new token
    slot_offsets: torch.Tensor  # (T,) long, offset inside that block
    decode: DecodeGroup | None
    prefills: list[PrefillChunk]
    logits_rows: torch.Tensor  # (S,) long, rows whose next-token logits are wanted
    wanted: torch.Tensor  # (R,) long, which of the S logits rows sampling needs on the host
    space: GatherSpace  # where the attention gathers context blocks
    adapter_rows: torch.Tensor | None = None  # (T,) long, each row's LoRA slot (-1: none); None: no adapter
    lora: StepLora | None = None  # the rows' adapters (engine/runners/model/lora.py): set per step


class RMSNorm(nn.Module):
    """Normalised in float32 (as Hugging Face does), then scaled by the weight in the model's dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), self.weight.shape, None, self.eps).to(x.dtype)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """(hd/2,) float32 inverse frequencies, llama3-scaled when the config says so."""
    hd = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    s = config.rope_scaling
    if s is None:
        return inv_freq
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


@dataclasses.dataclass(slots=True)
class Rotary:
    """Per-step tables: x -> x * cos + rotate_half(x) * sin, with rotate_half(x) * sin written as
    (x's halves swapped) * (sin with its first half negated): one copy and two products per call."""

    cos: torch.Tensor  # (T, 1, hd)
    sin: torch.Tensor  # (T, 1, hd), first half negated

    @classmethod
    def at(cls, positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> Rotary:
        freqs = positions[:, None].float() * inv_freq  # (T, hd/2)
        cos, sin = freqs.cos(), freqs.sin()
        return cls(torch.cat((cos, cos), dim=-1).to(dtype).unsqueeze(1),
                   torch.cat((-sin, sin), dim=-1).to(dtype).unsqueeze(1))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: (T, heads, hd) -> a new (T, heads, hd)."""
        swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
        return torch.addcmul(x * self.cos, swapped, self.sin)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.nh, self.kvh, self.hd = config.num_heads, config.num_kv_heads, config.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, (self.nh + 2 * self.kvh) * self.hd,
                                  bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.nh * self.hd, config.hidden_size, bias=config.o_bias)

    def forward(self, x: torch.Tensor, rope: Rotary, batch: StepBatch, pool: KVPool) -> torch.Tensor:
        T = x.shape[0]
        nh, kvh, hd = self.nh, self.kvh, self.hd
        qkv = self.qkv_proj(x)  # (T, (nh + 2 kvh) hd): q heads, k heads, v heads
        if batch.lora is not None:
            qkv = batch.lora.add(self.layer, "qkv", x, qkv)
        qk = rope(qkv[:, :(nh + kvh) * hd].view(T, nh + kvh, hd))  # one RoPE for q and k
        q, k, v = qk[:, :nh], qk[:, nh:], qkv[:, (nh + kvh) * hd:].view(T, kvh, hd)
        pool.write(self.layer, batch.slot_blocks, batch.slot_offsets, k, v)
        d = batch.decode
        if not batch.prefills:  # decodes only: the attention's output is the whole step's
            assert d is not None  # a step has work
            kc, vc = pool.gather(self.layer, d.block_ids, batch.space)
            return self._out(attention.decode_attention(q, kc, vc, d.key_mask).view(T, nh * hd), batch.lora)
        out = x.new_empty(T, nh, hd)
        if d is not None:
            kc, vc = pool.gather(self.layer, d.block_ids, batch.space)
            out[:d.num_seqs] = attention.decode_attention(q[:d.num_seqs], kc, vc, d.key_mask)
        for p in batch.prefills:
            rows = slice(p.row_start, p.row_start + p.num_new)
            out[rows] = self._chunk(p, q[rows], k[rows], v[rows], batch, pool)
        return self._out(out.view(T, nh * hd), batch.lora)  # (T, H)

    def _out(self, o: torch.Tensor, lora: StepLora | None) -> torch.Tensor:
        y = self.o_proj(o)
        return y if lora is None else lora.add(self.layer, "o", o, y)

    def _chunk(self, p: PrefillChunk, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               batch: StepBatch, pool: KVPool) -> torch.Tensor:
        """One prefill chunk's attention: q (n, nh, hd), its fresh k, v (n, kvh, hd) -> (n, nh, hd)."""
        if p.block_ids is None:
            return attention.causal_attention(q, k, v)
        if p.mask is None:  # split: the cached prefix's blocks only
            kc, vc = pool.gather(self.layer, p.block_ids[:-(-p.start_pos // pool.block_size)], batch.space)
            return attention.split_prefix_attention(q, kc[:p.start_pos], vc[:p.start_pos], k, v)
        kc, vc = pool.gather(self.layer, p.block_ids, batch.space)  # the whole context, this step's K/V included
        return attention.masked_attention(q, kc, vc, p.mask)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size,
                                      bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor, lora: StepLora | None) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if lora is not None:
            gate_up = lora.add(self.layer, "gate_up", x, gate_up)
        gate, up = gate_up.chunk(2, dim=-1)  # (T, I) each
        h = F.silu(gate) * up
        return self.down_proj(h) if lora is None else lora.add(self.layer, "down", h, self.down_proj(h))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config, layer)

    def forward(self, x: torch.Tensor, rope: Rotary, batch: StepBatch, pool: KVPool) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, batch, pool)
        return x + self.mlp(self.post_attention_layernorm(x), batch.lora)


class Llama(nn.Module):
    """Parameters are created on the meta device; `loader.build_model` assigns real ones."""

    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.config = config
        with torch.device("meta"):
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
            self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
            self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.inv_freq = rope_inv_freq(config).to(device)  # (hd/2,) float32, not a parameter
        self.lora: LoraWeights | None = None  # adapter slots (--lora-modules), set by the runner

    def forward(self, batch: StepBatch, pool: KVPool) -> torch.Tensor:
        """Runs the step, writing its K/V into `pool`; returns (S, V) float32 logits."""
        x = self.embed_tokens(batch.input_ids)  # (T, H)
        rope = Rotary.at(batch.positions, self.inv_freq, x.dtype)
        if batch.adapter_rows is not None and self.lora is not None:
            batch.lora = self.lora.step(batch.adapter_rows, x.dtype)
        self._masks(batch, pool)
        for layer in self.layers:
            x = layer(x, rope, batch, pool)
        x = self.norm(x.index_select(0, batch.logits_rows))  # (S, H)
        return self.lm_head(x).float()  # (S, V)

    def _masks(self, batch: StepBatch, pool: KVPool) -> None:
        """What every layer's attention shares, built once: the decode key mask, the chunks' masks."""
        bs, d = pool.block_size, batch.decode
        if d is not None:
            keys = torch.arange(d.block_ids.shape[0] // d.num_seqs * bs, device=pool.device)
            d.key_mask = (keys[None, :] < d.context_lens[:, None])[:, None, None, :]  # (B, 1, 1, L)
        if attention.splits_prefix(pool.device):
            return
        rep = self.config.num_heads // self.config.num_kv_heads
        for p in batch.prefills:
            if p.block_ids is not None:
                p.mask = ChunkMask.build(p.start_pos, p.num_new, p.block_ids.shape[0] * bs, rep, pool.device)
