"""One engine's capacities from its cost model: what the planner needs (as Dynamo's planner
takes them from a profiling run).

    prefill_tokens_per_s   prompt tokens per second with full `max_batched_tokens` chunks
    decode_tokens_per_s    output tokens per second at the largest batch (up to `max_running`)
                           whose step still meets the TPOT SLO, at `context_tokens` of context
    decode_step_s, decode_seq_s, decode_context_s, max_running
                           the decode step model, for the planner to size decode at any context

    kvroute sim --profile --cost-model a100-llama2-7b --slo-tpot 0.025 [--profile-context 2000]
"""

from __future__ import annotations

from kvroute.engine.runners.cost_model import CostModel


def profile(model: CostModel, slo_tpot_s: float, context_tokens: int = 2000, max_batched_tokens: int = 2048,
            max_running: int = 64) -> dict:
    prefill_s = model.prefill_time(max_batched_tokens)
    best = 0
    for batch in range(1, max_running + 1):
        if decode_step(model, batch, context_tokens) <= slo_tpot_s:
            best = batch
    decode = best / decode_step(model, best, context_tokens) if best else 0.0
    return {"cost_model": model.name, "slo_tpot_s": slo_tpot_s, "context_tokens": context_tokens,
            "prefill_tokens_per_s": max_batched_tokens / prefill_s, "decode_tokens_per_s": decode,
            "decode_batch_at_slo": best, "decode_step_s": model.step_s, "decode_seq_s": model.decode_seq_s,
            "decode_context_s": model.decode_context_s, "max_running": max_running}


def decode_step(model: CostModel, batch: int, context_tokens: int) -> float:
    return model.step_s + batch * (model.decode_seq_s + model.decode_context_s * context_tokens)
