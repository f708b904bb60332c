"""A Llama-family forward over a paged K/V pool, in one file.

One call runs a step: the new tokens of several sequences, flattened into T rows. Rows of
decode sequences (one new token each) come first, then each prefill chunk as a contiguous
run of rows. Every layer writes the new K/V into the pool, then attends over each
sequence's whole context read back from the pool through its block table:

- decodes: one SDPA call for all of them, padded to the longest context with a key mask;
  the n_rep query heads sharing a KV head ride in SDPA's query-length dimension (no K/V copy);
- prefill chunks: one SDPA call each, `is_causal` on the fresh K/V when nothing is cached;
  with a cached prefix, the prefix (read from the pool, no mask needed) and the chunk's own
  causal part are attended separately and merged (`prefix_attention`), so a chunk costs
  n * (start_pos + n/2) score pairs, never (start_pos + n)^2.

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

from engine.runners.model.config import ModelConfig
from engine.runners.model.kv_pool import KVPool


@dataclasses.dataclass(slots=True)
class DecodeGroup:
    num_seqs: int  # rows [0, num_seqs) of the step
    block_tables: torch.Tensor  # (B, nblk) long, padded with any valid block id
    key_mask: torch.Tensor  # (B, 1, 1, nblk * bs) bool, True where key position < context_len


@dataclasses.dataclass(slots=True)
class PrefillChunk:
    row_start: int  # rows [row_start, row_start + num_new) of the step
    num_new: int
    start_pos: int  # positions < start_pos are read from the pool
    prefix_blocks: torch.Tensor | None  # (1, ceil(start_pos / bs)) long; None when start_pos == 0


@dataclasses.dataclass(slots=True)
class StepBatch:
    input_ids: torch.Tensor  # (T,) long
    positions: torch.Tensor  # (T,) long
    slot_blocks: torch.Tensor  # (T,) long, pool block of each new token
    slot_offsets: torch.Tensor  # (T,) long, offset inside that block
    decode: DecodeGroup | None
    prefills: list[PrefillChunk]
    logits_rows: torch.Tensor  # (S,) long, rows whose next-token logits are wanted


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


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


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# Returns the log-sum-exp with the output, which lets two partial attentions be merged.
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def prefix_attention(q: torch.Tensor, k_pre: torch.Tensor, v_pre: torch.Tensor,
                     k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
    """n new rows attend to P cached keys (all visible) and, causally, to their own n keys.

    q: (1, nh, n, hd); k_pre, v_pre: (1, kvh, P, hd); k_new, v_new: (1, kvh, n, hd).
    On CPU: two flash calls (no mask over the prefix) merged by log-sum-exp; elsewhere one
    masked SDPA call over the concatenated keys. Returns (1, nh, n, hd).
    """
    _, nh, n, hd = q.shape
    kvh, P = k_pre.shape[1], k_pre.shape[2]
    if _FLASH_CPU is None or q.device.type != "cpu":
        k, v = torch.cat((k_pre, k_new), dim=2), torch.cat((v_pre, v_new), dim=2)  # (1, kvh, P+n, hd)
        mask = torch.full((n, P + n), float("-inf"), dtype=q.dtype, device=q.device).triu_(P + 1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    r = nh // kvh
    o_pre, lse_pre = _FLASH_CPU(q.reshape(1, kvh, r * n, hd), k_pre, v_pre)  # (1, kvh, r*n, hd)
    o_new, lse_new = _FLASH_CPU(q, k_new.repeat_interleave(r, 1), v_new.repeat_interleave(r, 1),
                                is_causal=True)  # (1, nh, n, hd), lse (1, nh, n)
    lse_pre, lse_new = lse_pre.reshape(1, nh, n, 1), lse_new.unsqueeze(-1)
    lse = torch.logaddexp(lse_pre, lse_new)  # (1, nh, n, 1) float32
    o = o_pre.reshape(1, nh, n, hd) * (lse_pre - lse).exp() + o_new * (lse_new - lse).exp()
    return o.to(q.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.nh, self.kvh, self.hd = config.num_heads, config.num_kv_heads, config.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, (self.nh + 2 * self.kvh) * self.hd,
                                  bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.nh * self.hd, config.hidden_size, bias=config.o_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                batch: StepBatch, pool: KVPool) -> torch.Tensor:
        T = x.shape[0]
        nh, kvh, hd = self.nh, self.kvh, self.hd
        qk, v = self.qkv_proj(x).split([(nh + kvh) * hd, kvh * hd], dim=-1)
        qk = qk.view(T, nh + kvh, hd)  # q heads then k heads: one RoPE for both
        qk = qk * cos + rotate_half(qk) * sin  # cos, sin: (T, 1, hd)
        q, k, v = qk[:, :nh], qk[:, nh:], v.view(T, kvh, hd)  # (T, nh, hd), (T, kvh, hd) x2
        pool.write(self.layer, batch.slot_blocks, batch.slot_offsets, k, v)
        out = x.new_empty(T, nh, hd)
        if batch.decode is not None:
            d = batch.decode
            B = d.num_seqs
            kc, vc = pool.gather(self.layer, d.block_tables)  # (B, kvh, L, hd)
            qd = q[:B].view(B, kvh, nh // kvh, hd)  # query heads of one KV head side by side
            o = F.scaled_dot_product_attention(qd, kc, vc, attn_mask=d.key_mask)
            out[:B] = o.view(B, nh, hd)
        for p in batch.prefills:
            rows = slice(p.row_start, p.row_start + p.num_new)
            qp = q[rows].transpose(0, 1).unsqueeze(0)  # (1, nh, n, hd)
            kn = k[rows].transpose(0, 1).unsqueeze(0)  # (1, kvh, n, hd)
            vn = v[rows].transpose(0, 1).unsqueeze(0)
            if p.prefix_blocks is None:
                o = F.scaled_dot_product_attention(qp, kn, vn, is_causal=True, enable_gqa=True)
            else:
                kc, vc = pool.gather(self.layer, p.prefix_blocks)  # (1, kvh, >= P, hd)
                P = p.start_pos
                o = prefix_attention(qp, kc[:, :, :P], vc[:, :, :P], kn, vn)
            out[rows] = o[0].transpose(0, 1)
        return self.o_proj(out.view(T, nh * hd))  # (T, H)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size,
                                      bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (T, I) each
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                batch: StepBatch, pool: KVPool) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, batch, pool)
        return x + self.mlp(self.post_attention_layernorm(x))


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

    def forward(self, batch: StepBatch, pool: KVPool) -> torch.Tensor:
        """Runs the step, writing its K/V into `pool`; returns (S, V) float32 logits."""
        x = self.embed_tokens(batch.input_ids)  # (T, H)
        freqs = batch.positions[:, None].float() * self.inv_freq  # (T, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (T, hd)
        cos = emb.cos().to(x.dtype).unsqueeze(1)  # (T, 1, hd)
        sin = emb.sin().to(x.dtype).unsqueeze(1)
        for layer in self.layers:
            x = layer(x, cos, sin, batch, pool)
        x = self.norm(x[batch.logits_rows])  # (S, H)
        return self.lm_head(x).float()  # (S, V)
