"""Next-token sampling: greedy, temperature, top-p; reproducible per request when seeded.

A request with `SamplingParams.seed` draws its n-th token from a fresh `torch.Generator`
seeded with mix(seed, n), so its tokens don't depend on what else shares the batch.
Unseeded requests draw from the runner's own generator.
"""

from __future__ import annotations

from typing import Sequence

import torch

from engine.work import SamplingParams

_MASK64 = (1 << 64) - 1


def step_seed(seed: int, num_generated: int) -> int:
    """splitmix64 of (seed, step): well-spread 63-bit seeds for neighbouring steps."""
    z = (seed * 0x9E3779B97F4A7C15 + num_generated + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs: (V,) -> (V,) renormalized over the smallest set whose mass reaches top_p."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(descending=True)
    before = sorted_probs.cumsum(0) - sorted_probs  # mass strictly ahead of each token
    sorted_probs[before >= top_p] = 0.0  # the first token always stays
    kept = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return kept / kept.sum()


def sample(logits: torch.Tensor, params: Sequence[SamplingParams], num_generated: Sequence[int],
           generator: torch.Generator) -> list[int]:
    """logits: (S, V) float32, one row per sampling request -> S token ids."""
    logits = logits.float().cpu()
    tokens = logits.max(dim=-1).indices.tolist()  # greedy answer for every row, kept where asked
    for row, (p, n) in enumerate(zip(params, num_generated)):
        if p.greedy:
            continue
        probs = torch.softmax(logits[row] / p.temperature, dim=-1)  # (V,)
        probs = top_p_filter(probs, p.top_p)
        gen = generator if p.seed is None else torch.Generator().manual_seed(step_seed(p.seed, n))
        tokens[row] = int(torch.multinomial(probs, 1, generator=gen).item())
    return tokens
