"""Logit edits before sampling, with vLLM's semantics (see SamplingParams for the order).

Each function takes one row of logits, (V,) float32, and edits it in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvroute.engine.core.work import SamplingParams


def apply_logit_bias(row: torch.Tensor, bias: Sequence[tuple[int, float]]) -> None:
    if bias:
        ids = torch.tensor([t for t, _ in bias], dtype=torch.long)
        row.index_add_(0, ids, torch.tensor([b for _, b in bias], dtype=row.dtype))


def apply_penalties(row: torch.Tensor, prompt_ids: Sequence[int], output_ids: Sequence[int],
                    p: SamplingParams) -> None:
    """repetition (prompt and output tokens), then frequency and presence (output tokens)."""
    vocab = row.shape[0]
    counts = torch.bincount(torch.tensor(output_ids, dtype=torch.long), minlength=vocab)[:vocab] \
        if output_ids else torch.zeros(vocab, dtype=torch.long)
    seen = counts > 0
    if p.repetition_penalty != 1.0:
        mask = seen.clone()
        if prompt_ids:
            mask[torch.tensor(prompt_ids, dtype=torch.long)] = True
        penalized = torch.where(row > 0, row / p.repetition_penalty, row * p.repetition_penalty)
        row.copy_(torch.where(mask, penalized, row))
    if p.frequency_penalty:
        row.sub_(p.frequency_penalty * counts.to(row.dtype))
    if p.presence_penalty:
        row.sub_(p.presence_penalty * seen.to(row.dtype))
