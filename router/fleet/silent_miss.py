"""Silent misses: an engine whose cache the index does not describe, named with its likely cause.

A router that cannot reproduce an engine's block keys credits it nothing, and says so when
the engine advertises why (router/fleet/fleet_shape.py: tokenizer, hash seed, block size at
/kv/info). An engine can also differ without saying so: a sidecar adding a cache salt, an
adapter or template the router does not know, a block size that is not the advertised one.
Then the index and the engine disagree, request after request: the engine serves hits the
index never predicted (its events carry keys no lookup asks for), or the index predicts hits
the engine does not serve. Fed each request's routing-loss sample (router/decision/routing_loss.py)
with what the engine reported, this keeps per instance its last `window` samples and raises an
alarm when, over at least `min_samples` samples that predicted or served a hit,

    unpredicted   at least `raise_share` of the tokens the engine served were not predicted, or
    unserved      at least `raise_share` of the tokens the index predicted were not served

(cleared when both shares fall below `clear_share`), with the likely cause, from the evidence:

    tokenizer      the engine counts most prompts' tokens otherwise (usage.prompt_tokens): its
                   tokenizer or chat template is not the router's
    block_size     the cached tokens the engine serves are not whole router blocks, or all of
                   at least three different lengths are whole multiples of a larger block
    lora_adapter   the misses come from requests for a LoRA adapter (a model other than the
                   engine's base model), the others' hits agree
    hash_seed      otherwise: the same tokens and block size, other keys (a hash seed or a cache
                   salt the router does not apply)

Pure, no clock: the router service raises and clears the alarm (router/service/silent_miss_alarms.py).
"""

from __future__ import annotations

import collections
import math

import msgspec

CAUSES = {
    "tokenizer": "tokenizer or chat template: the engine counts prompt tokens otherwise",
    "block_size": "block size: the engine's cached tokens are not whole router blocks of the advertised size",
    "lora_adapter": "LoRA adapter: requests for an adapter miss, the others agree",
    "hash_seed": "hash seed or cache salt: same tokens and block size, other block keys",
}


class Evidence(msgspec.Struct, frozen=True, kw_only=True):
    served: int  # cached tokens the engine reported
    predicted: int  # the index's prediction for the chosen instance
    prompt_tokens: int  # the router's count
    engine_prompt_tokens: int | None = None  # the engine's (usage.prompt_tokens)
    adapter: bool = False  # the request named a model other than the engine's base model


class Alarm(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # "unpredicted" or "unserved"
    cause: str  # a key of CAUSES
    share: float  # of the served (unpredicted) or predicted (unserved) tokens
    samples: int

    def to_dict(self) -> dict:
        return {"alarm": f"silent_miss_{self.kind}", "cause": self.cause, "likely_cause": CAUSES[self.cause],
                "share": round(self.share, 3), "samples": self.samples}


class SilentMiss:
    def __init__(self, window: int = 64, min_samples: int = 6, raise_share: float = 0.9,
                 clear_share: float = 0.5) -> None:
        if not 0 < clear_share < raise_share <= 1 or min_samples < 1 or window < min_samples:
            raise ValueError("silent-miss thresholds: 0 < clear_share < raise_share <= 1, 1 <= min_samples <= window")
        self.window, self.min_samples = window, min_samples
        self.raise_share, self.clear_share = raise_share, clear_share
        self._samples: dict[str, collections.deque[Evidence]] = {}
        self.alarms: dict[str, Alarm] = {}

    def forget(self, instance: str) -> None:
        self._samples.pop(instance, None)
        self.alarms.pop(instance, None)

    def observe(self, instance: str, evidence: Evidence, block_size: int) -> tuple[Alarm | None, bool]:
        """Add one sample: (the instance's alarm now, whether it was raised or cleared by this one)."""
        samples = self._samples.get(instance)
        if samples is None:
            samples = self._samples[instance] = collections.deque(maxlen=self.window)
        samples.append(evidence)
        before = self.alarms.get(instance)
        now = self._judge(samples, block_size, before)
        if now is None:
            self.alarms.pop(instance, None)
        else:
            self.alarms[instance] = now
        return now, (before is None) != (now is None)

    def _judge(self, samples, block_size: int, before: Alarm | None) -> Alarm | None:
        telling = [e for e in samples if e.served or e.predicted]
        if len(telling) < self.min_samples:
            return before
        served = sum(e.served for e in telling)
        predicted = sum(e.predicted for e in telling)
        unpredicted = sum(max(0, e.served - e.predicted) for e in telling) / served if served else 0.0
        unserved = sum(max(0, e.predicted - e.served) for e in telling) / predicted if predicted else 0.0
        kind, share = ("unpredicted", unpredicted) if unpredicted >= unserved else ("unserved", unserved)
        if share >= self.raise_share or (before is not None and share >= self.clear_share):
            return Alarm(kind=kind, cause=likely_cause(samples, block_size), share=share, samples=len(telling))
        return None


def likely_cause(samples, block_size: int) -> str:
    """Which difference between the router and the engine the samples point at (a key of CAUSES)."""
    counted = [e for e in samples if e.engine_prompt_tokens is not None]
    if counted and sum(e.engine_prompt_tokens != e.prompt_tokens for e in counted) * 2 > len(counted):
        return "tokenizer"
    served = {e.served for e in samples if e.served}
    if served:
        g = math.gcd(*served)
        if g % block_size or (g >= 2 * block_size and len(served) >= 3):  # 3 lengths, all of a bigger block
            return "block_size"
    missed = [e for e in samples if e.served != e.predicted]
    if missed and sum(e.adapter for e in missed) * 5 >= len(missed) * 4 and not all(e.adapter for e in samples):
        return "lora_adapter"
    return "hash_seed"
