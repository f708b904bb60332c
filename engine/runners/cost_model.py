"""Step-time cost model for the simulated runner and the cluster simulator.

    step_time = step_s
              + prefill_token_s  * (new tokens of prefill chunks)
              + prefill_pair_s   * (sum over prefill chunks of new tokens x mean attended context)
              + decode_seq_s     * (decode sequences)
              + decode_context_s * (sum of decode sequences' context lengths)
              + adapter_load_s   * (LoRA adapters loaded into a slot for the step)

A prefill chunk is compute-bound (per token, plus attention per attended pair); a
decode step is memory-bound (per sequence, plus reading each context token's K/V).
`kvroute engine --backend sim --calibrate` fits these to the torch runner here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvroute.engine.core.work import SeqWork

if TYPE_CHECKING:  # an annotation only: the cost model's users (the runner config) need not load the scheduler
    from kvroute.engine.core.scheduler import Step


@dataclasses.dataclass(frozen=True)
class CostModel:
    name: str
    step_s: float
    prefill_token_s: float
    prefill_pair_s: float
    decode_seq_s: float
    decode_context_s: float
    description: str = ""
    kv_bytes_per_token: int = 0  # K/V bytes of one token (all layers), for modelled transfers; 0 = the model's
    adapter_load_s: float = 0.0  # copying one LoRA adapter's weights into a device slot (engine/core/adapter_slots.py)


    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float) and v < 0:
                raise ValueError(f"cost model coefficient {f.name} must be >= 0, got {v}")

    def features(self, works: Sequence[SeqWork]) -> tuple[float, float, float, float]:
        return chunk_features([w.start_pos for w in works], [len(w.token_ids) for w in works])

    def step_time(self, works: Sequence[SeqWork], adapter_loads: int = 0) -> float:
        if not works:
            return 0.0
        return self._time(self.features(works), adapter_loads)

    def scheduled_time(self, step: Step, adapter_loads: int = 0) -> float:
        """`step_time(step.works(), adapter_loads)` read straight from the scheduler's step: the
        simulator's (loadgen/sim/instance.py), where building the works costs more than the rest of a step."""
        if not step.seqs:
            return 0.0
        return self._time(chunk_features([seq.num_computed for seq in step.seqs], step.num_tokens), adapter_loads)

    def _time(self, features: tuple[float, float, float, float], adapter_loads: int) -> float:
        p_tok, p_pair, d_seq, d_ctx = features
        return (
            self.step_s
            + self.prefill_token_s * p_tok
            + self.prefill_pair_s * p_pair
            + self.decode_seq_s * d_seq
            + self.decode_context_s * d_ctx
            + self.adapter_load_s * adapter_loads
        )

    def prefill_time(self, num_tokens: int, cached: int = 0) -> float:
        """Time of one step that prefills `num_tokens - cached` tokens after a cached prefix."""
        n = num_tokens - cached
        return self.step_s + self.prefill_token_s * n + self.prefill_pair_s * n * (cached + (n + 1) / 2)


def chunk_features(starts: Sequence[int], counts: Sequence[int]) -> tuple[float, float, float, float]:
    """(prefill tokens, prefill attended pairs, decode sequences, decode context tokens) of a step whose
    chunks start at `starts` (tokens computed before) with `counts` new tokens each."""
    p_tok = p_pair = d_seq = d_ctx = 0.0
    for start, n in zip(starts, counts):
        if n > 1 or not start:
            p_tok += n
            p_pair += n * (start + (n + 1) / 2)
        else:
            d_seq += 1
            d_ctx += start + 1
    return p_tok, p_pair, d_seq, d_ctx


COST_MODELS: dict[str, CostModel] = {
    # Fitted on this project's 2-core CI-class machine (torch runner, built-in tiny
    # model, 1 thread) with `kvroute engine --backend sim --calibrate`.
    "cpu-tiny": CostModel(
        name="cpu-tiny",
        step_s=1.73e-3,
        prefill_token_s=3.04e-5,
        prefill_pair_s=2.36e-8,
        decode_seq_s=0.0,
        decode_context_s=7.7e-7,
        description="torch runner, tiny model, 1 CPU thread (calibrated here: median fit error 4.8%)",
        # a rank-16 adapter of all seven projections copied into a slot: median of 200 LoraWeights.ensure here
        adapter_load_s=8.0e-5,
    ),
    # Llama-2-7B (6.7B params, fp16, 32 layers x 4096, 0.5 MiB of K/V per token) on one
    # A100-80GB (312 TFLOP/s fp16 dense, 2.0 TB/s HBM) from its published peak figures:
    # prefill at 50% of peak FLOPs (2 x 6.7e9 FLOP/token -> ~11.6k tokens/s) and attention
    # 4 x 4096 x 32 FLOP per pair; decode bound by reading 13.4 GB of weights per step
    # (~7 ms at 95% of peak bandwidth) plus each context token's K/V.
    "a100-llama2-7b": CostModel(
        name="a100-llama2-7b",
        step_s=7.0e-3,
        prefill_token_s=8.6e-5,
        prefill_pair_s=3.4e-12,
        decode_seq_s=3.0e-5,
        decode_context_s=2.8e-7,
        description="Llama-2-7B fp16 on one A100-80GB, from published peak figures",
        kv_bytes_per_token=2 * 32 * 4096 * 2,  # K and V, 32 layers, 4096 wide, fp16: 0.5 MiB
        # a rank-16 adapter of all seven projections (40 M parameters, 80 MB fp16) from pinned host memory
        # over PCIe 4.0 x16 at 25 GB/s
        adapter_load_s=3.2e-3,
    ),
}
DEFAULT_COST_MODEL = "cpu-tiny"


def get_cost_model(name: str) -> CostModel:
    try:
        return COST_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown cost model {name!r}; choose from {', '.join(COST_MODELS)}") from None
