"""Next-token sampling: greedy, temperature, top-k, min-p, top-p; logit edits and logprobs.

A request with `SamplingParams.seed` draws its n-th token from a fresh `torch.Generator`
seeded with mix(seed, n), so its tokens don't depend on what else shares the batch.
Unseeded requests draw from the runner's own generator. `sample_works` is what a runner
calls: logit bias and penalties (engine/runners/logits_processors.py), then `sample`, plus the
logprobs the works asked for, taken from the raw logits as vLLM V1 does by default.
"""

from __future__ import annotations

from typing import Sequence

import torch

from engine.runners.logits_processors import apply_logit_bias, apply_penalties
from engine.core.work import SampledTokens, SamplingParams, SeqWork, TokenLogprobs

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


def top_k_min_p_filter(probs: torch.Tensor, top_k: int, min_p: float) -> torch.Tensor:
    """probs: (V,) -> (V,) keeping the top_k most likely (0/-1: all) and those >= min_p x the best."""
    if 0 < top_k < probs.shape[0]:
        threshold = probs.topk(top_k).values[-1]
        probs = torch.where(probs >= threshold, probs, torch.zeros_like(probs))
    if min_p > 0.0:
        probs = torch.where(probs >= min_p * probs.max(), probs, torch.zeros_like(probs))
    return probs / probs.sum()


def sample(logits: torch.Tensor, params: Sequence[SamplingParams], num_generated: Sequence[int],
           generator: torch.Generator) -> list[int]:
    """logits: (S, V) float32, one row per sampling request -> S token ids."""
    logits = logits.float().cpu()
    tokens = logits.max(dim=-1).indices.tolist()  # greedy answer for every row, kept where asked
    for row, (p, n) in enumerate(zip(params, num_generated)):
        if p.greedy:
            continue
        probs = torch.softmax(logits[row] / p.temperature, dim=-1)  # (V,)
        probs = top_p_filter(top_k_min_p_filter(probs, p.top_k, p.min_p), p.top_p)
        gen = generator if p.seed is None else torch.Generator().manual_seed(step_seed(p.seed, n))
        tokens[row] = int(torch.multinomial(probs, 1, generator=gen).item())
    return tokens


def token_logprobs(logprobs: torch.Tensor, token_id: int, num_top: int) -> TokenLogprobs:
    """logprobs: (V,) log-softmax of one row -> the token's and the num_top best."""
    top = ()
    if num_top > 0:
        values, ids = logprobs.topk(min(num_top, logprobs.shape[0]))
        top = tuple(zip(ids.tolist(), values.tolist()))
    return TokenLogprobs(token_id, float(logprobs[token_id]), top)


def sample_works(logits: torch.Tensor, works: Sequence[SeqWork], generator: torch.Generator) -> SampledTokens:
    """logits: (S, V), one row per work -> one token per work, with the logprobs the works asked for."""
    logits = logits.float().cpu()
    raw = logits
    if any(w.sampling.edits_logits for w in works):
        logits = logits.clone()
        for row, w in enumerate(works):
            apply_logit_bias(logits[row], w.sampling.logit_bias)
            if w.sampling.needs_history:
                apply_penalties(logits[row], w.prompt_ids, w.output_ids, w.sampling)
    tokens = sample(logits, [w.sampling for w in works], [w.num_generated for w in works], generator)
    wanted = [row for row, w in enumerate(works) if w.sampling.logprobs is not None]
    logprobs: list[TokenLogprobs | None] = [None] * len(works)
    if wanted:
        rows = torch.log_softmax(raw[wanted], dim=-1)  # (R, V)
        for i, row in enumerate(wanted):
            logprobs[row] = token_logprobs(rows[i], tokens[row], works[row].sampling.logprobs)
    return SampledTokens(tokens, logprobs)
