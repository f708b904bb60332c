"""How big each step of the device check is, by device and --quick, and the checkpoint shapes."""

from __future__ import annotations

import dataclasses

VOCAB, MAX_POS = 8192, 8192  # the built-in tokenizer's vocabulary
SHAPES = {  # hidden, layers, heads, KV heads, intermediate, dtype
    "tiny": (256, 2, 4, 2, 768, "float32"),
    "1b": (2048, 16, 32, 8, 8192, "bfloat16"),
    "3b": (3072, 28, 24, 8, 8192, "bfloat16"),
    "8b": (4096, 32, 32, 8, 14336, "bfloat16"),
}
STEPS = ("memcpy", "prefill", "decode", "serving", "bench", "tiers", "pd_pull")


@dataclasses.dataclass(frozen=True)
class Plan:
    """How big each step is: by device and --quick."""

    prompt: int  # tokens of the prefill and serving prompt
    decode_context: int
    decode_steps: int
    reps: int
    memcpy_mib: int
    engines: int
    bench: tuple[str, ...]  # kvroute bench sizing flags
    storm: tuple[str, ...]  # kvroute bench --tiers sizing flags
    pulls: int
    quick: bool = False
    policies: str = "round_robin,prefix_hash,kv_aware"
    tier_runs: str = "device,host,host+redis"


def plan_for(device: str, quick: bool) -> Plan:
    if device.startswith("cuda"):
        return Plan(4096, 1024, 32, 5, 1024, 4, ("--num-requests", "120", "--rate", "12"),
                    ("--num-blocks", "512", "--host-blocks", "2048"), 8)
    if not quick:
        return Plan(2048, 512, 16, 5, 256, 4, ("--num-requests", "40", "--rate", "8"),
                    ("--num-blocks", "256", "--host-blocks", "2048", "--sessions", "12", "--burst", "12",
                     "--idle-requests", "16", "--idle-rate", "16"), 4)
    return Plan(1024, 128, 4, 2, 32, 1, ("--num-requests", "4", "--rate", "8", "--groups", "2",
                                           "--prefix-tokens", "512", "--output-tokens", "4"),
                ("--num-blocks", "64", "--host-blocks", "256", "--sessions", "3", "--burst", "3",
                 "--context-tokens", "768", "--min-context-tokens", "512", "--idle-requests", "4",
                 "--idle-tokens", "512", "--idle-rate", "20", "--session-rate", "20", "--output-tokens", "4",
                 "--gap", "0.5", "--burst-spread", "0.2"), 2,
                quick=True, policies="kv_aware", tier_runs="device,host+redis")  # every step, the fewest processes
