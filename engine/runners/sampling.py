"""Next-token sampling: greedy, temperature, top-k, min-p, top-p; logit edits and logprobs.

A request with `SamplingParams.seed` draws its n-th token from a fresh `torch.Generator`
seeded with mix(seed, n), so its tokens don't depend on what else shares the batch.
Unseeded requests draw from the runner's own generator. `sample_works` is what a runner
calls with what its step read back: a greedy row without logit edits takes the device's argmax;
the others get logit bias and penalties (engine/runners/logits_processors.py), then `sample`, plus
the logprobs the works asked for, taken from the raw logits as vLLM V1 does by default.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvroute.engine.core.work import SampledTokens, SamplingParams, SeqWork, TokenLogprobs
from kvroute.engine.runners.logits_processors import apply_logit_bias, apply_penalties
from kvroute.engine.runners.readback import HostLogits

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
    top: tuple[tuple[int, float], ...] = ()
    if num_top > 0:
        values, ids = logprobs.topk(min(num_top, logprobs.shape[0]))
        top = tuple(zip(ids.tolist(), values.tolist()))
    return TokenLogprobs(token_id, float(logprobs[token_id]), top)


def sample_works(host: HostLogits, works: Sequence[SeqWork], generator: torch.Generator) -> SampledTokens:
    """One token per work from what the step read back (engine/runners/readback.py): the device's argmax,
    or for the works whose sampling needs logits (`SamplingParams.needs_logits`, rows of `host.logits` in
    order) a draw from them, with the logprobs the works asked for."""
    tokens = list(host.greedy)
    need = [row for row, w in enumerate(works) if w.sampling.needs_logits]
    logprobs: list[TokenLogprobs | None] = [None] * len(works)
    if not need:
        return SampledTokens(tokens, logprobs)
    assert host.logits is not None  # rows were wanted (`need`): they were read back
    raw = host.logits.float()
    logits = raw
    if any(works[row].sampling.edits_logits for row in need):
        logits = raw.clone()
        for i, row in enumerate(need):
            w = works[row]
            apply_logit_bias(logits[i], w.sampling.logit_bias)
            if w.sampling.needs_history:
                apply_penalties(logits[i], w.prompt_ids, w.output_ids, w.sampling)
    drawn = sample(logits, [works[row].sampling for row in need], [works[row].num_generated for row in need],
                   generator)
    wanted = [i for i, row in enumerate(need) if works[row].sampling.logprobs is not None]
    rows = torch.log_softmax(raw[wanted], dim=-1) if wanted else None  # (W, V)
    for i, row in enumerate(need):
        tokens[row] = drawn[i]
    for j, i in enumerate(wanted):
        row = need[i]
        num_top = works[row].sampling.logprobs
        assert rows is not None and num_top is not None  # `wanted`: the works that asked for logprobs
        logprobs[row] = token_logprobs(rows[j], tokens[row], num_top)
    return SampledTokens(tokens, logprobs)
