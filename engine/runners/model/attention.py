"""Attention over the paged pool: the step's context blocks are gathered from the pool into
preallocated buffers (`kv_pool.GatherSpace`) and attended there, one SDPA call per group.

- decodes: one call for all of them, padded to the longest context with a key mask; the
  n_rep query heads sharing a KV head ride in SDPA's query-length dimension (no K/V copy);
- a prefill chunk with nothing cached: one causal call on its fresh K/V;
- a prefill chunk after a cached prefix: on CPU, the prefix (gathered, no mask needed) and the
  chunk's own causal part are attended separately and merged by log-sum-exp (`prefix_attention`),
  so a chunk costs n * (start_pos + n/2) score pairs; elsewhere the whole context, gathered after
  this step's K/V was written, in one masked call (`ChunkMask`), the query heads of a KV head side
  by side as for decodes.

FlexAttention with a paged block mask was measured against this on CPU (`python -m kvroute.benchmarks.attention`)
and lost: docs/engine.md#attention.
Shapes: B decode sequences, nh/kvh query/KV heads, r = nh/kvh, hd head dim, n new tokens,
P cached tokens, L gathered context (whole blocks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

# Returns the log-sum-exp with the output, which lets two partial attentions be merged.
_FLASH_CPU: Callable[..., Any] | None = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def splits_prefix(device: torch.device) -> bool:
    """Whether a chunk after a cached prefix attends the prefix and itself separately (CPU flash)."""
    return _FLASH_CPU is not None and device.type == "cpu"


@dataclasses.dataclass(slots=True)
class ChunkMask:
    """The masked path's (r*n, L) boolean mask of one chunk, built once per step for every layer."""

    mask: torch.Tensor

    @classmethod
    def build(cls, start_pos: int, num_new: int, context: int, rep: int, device: torch.device) -> ChunkMask:
        rows = torch.arange(start_pos, start_pos + num_new, device=device)  # each new token's position
        keys = torch.arange(context, device=device)
        return cls((keys[None, :] <= rows[:, None]).repeat(rep, 1))  # (r*n, L): rows of a KV head's r queries


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """q: (B, nh, hd); k, v: (B * L, kvh, hd) gathered; key_mask: (B, 1, 1, L) -> (B, nh, hd)."""
    B, nh, hd = q.shape
    kvh = k.shape[1]
    kc = k.view(B, -1, kvh, hd).transpose(1, 2)  # (B, kvh, L, hd)
    vc = v.view(B, -1, kvh, hd).transpose(1, 2)
    qd = q.view(B, kvh, nh // kvh, hd)  # query heads of one KV head side by side
    return F.scaled_dot_product_attention(qd, kc, vc, attn_mask=key_mask).view(B, nh, hd)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A chunk with nothing cached: q (n, nh, hd), k, v (n, kvh, hd) -> (n, nh, hd)."""
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       is_causal=True, enable_gqa=True)  # (1, nh, n, hd)
    return o[0].transpose(0, 1)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: ChunkMask) -> torch.Tensor:
    """A chunk over its whole gathered context: q (n, nh, hd); k, v (L, kvh, hd) -> (n, nh, hd)."""
    n, nh, hd = q.shape
    kvh = k.shape[1]
    qd = q.permute(1, 0, 2).reshape(1, kvh, (nh // kvh) * n, hd)  # rows (r, n) per KV head
    o = F.scaled_dot_product_attention(qd, k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask.mask)
    return o.view(nh, n, hd).transpose(0, 1)


def prefix_attention(q: torch.Tensor, k_pre: torch.Tensor, v_pre: torch.Tensor,
                     k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
    """n new rows attend to P cached keys (all visible) and, causally, to their own n keys (CPU flash).

    q: (1, nh, n, hd); k_pre, v_pre: (1, kvh, P, hd); k_new, v_new: (1, kvh, n, hd) -> (1, nh, n, hd).
    """
    _, nh, n, hd = q.shape
    kvh = k_pre.shape[1]
    r = nh // kvh
    assert _FLASH_CPU is not None  # callers ask splits_prefix first
    o_pre, lse_pre = _FLASH_CPU(q.reshape(1, kvh, r * n, hd), k_pre, v_pre)  # (1, kvh, r*n, hd)
    o_new, lse_new = _FLASH_CPU(q, k_new.repeat_interleave(r, 1), v_new.repeat_interleave(r, 1),
                                is_causal=True)  # (1, nh, n, hd), lse (1, nh, n)
    lse_pre, lse_new = lse_pre.reshape(1, nh, n, 1), lse_new.unsqueeze(-1)
    lse = torch.logaddexp(lse_pre, lse_new)  # (1, nh, n, 1) float32
    o = o_pre.reshape(1, nh, n, hd) * (lse_pre - lse).exp() + o_new * (lse_new - lse).exp()
    return o.to(q.dtype)


def split_prefix_attention(q: torch.Tensor, k_pre: torch.Tensor, v_pre: torch.Tensor,
                           k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
    """q (n, nh, hd); k_pre, v_pre (P, kvh, hd) gathered; k_new, v_new (n, kvh, hd) -> (n, nh, hd)."""
    heads_first = [t.transpose(0, 1)[None] for t in (q, k_pre, v_pre, k_new, v_new)]
    return prefix_attention(*heads_first)[0].transpose(0, 1)
