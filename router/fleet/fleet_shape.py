"""What the fleet's engines have in common, recomputed when an engine joins or changes:
per model the block size most of its engines use and the request limits their context
allows, and per engine what keeps the router from reproducing its cache keys.

Kept apart from the per-request path: routing reads these dicts, never scans engines.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable

from kvroute.router.contract.limits import Limits
from kvroute.router.contract.protocol import hash_seed
from kvroute.router.fleet.instance import EngineInfo, Instance

log = logging.getLogger(__name__)


class FleetShape:
    def __init__(self, tokenizer_fingerprint: str, max_prompt_chars: int = 0, max_body_bytes: int = 0) -> None:
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self.max_prompt_chars, self.configured_body_bytes = max_prompt_chars, max_body_bytes
        self.block_sizes: dict[str, int] = {}  # model -> the block size most of its engines use
        self.limits: dict[str, Limits] = {}
        self.max_body_bytes = self._limits(0, 0).max_body_bytes

    def _limits(self, max_model_len: int, vocab_size: int) -> Limits:
        return Limits.derive(max_model_len, vocab_size, self.max_prompt_chars, self.configured_body_bytes)

    def limits_for(self, model: str) -> Limits:
        return self.limits.get(model) or self._limits(0, 0)

    def update(self, instances: Iterable[Instance]) -> list[tuple[Instance, list[str]]]:
        """Recompute from the discovered instances; returns (instance, problems) for each."""
        infos = [(i, i.info) for i in instances if i.info is not None]
        sizes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        lens: dict[str, int] = collections.defaultdict(int)
        vocabs: dict[str, int] = collections.defaultdict(int)
        for _, info in infos:
            sizes[info.model][info.block_size] += 1
            lens[info.model] = max(lens[info.model], info.max_model_len)
            vocabs[info.model] = max(vocabs[info.model], info.vocab_size)
        self.block_sizes = {model: counts.most_common(1)[0][0] for model, counts in sizes.items()}
        # The body limit is the largest of any model's: a body is read before its model is known.
        self.limits = {m: self._limits(lens[m], vocabs[m]) for m in lens}
        self.max_body_bytes = max([lim.max_body_bytes for lim in self.limits.values()]
                                  or [self._limits(0, 0).max_body_bytes])
        return [(inst, self.problems_of(info)) for inst, info in infos]

    def problems_of(self, info: EngineInfo) -> list[str]:
        """Why the router cannot reproduce this engine's cache keys (empty: it can)."""
        problems = []
        if info.tokenizer != self.tokenizer_fingerprint:
            problems.append(f"tokenizer fingerprint {info.tokenizer} != router's {self.tokenizer_fingerprint}")
        if info.hash_seed != hash_seed(info.model):
            problems.append(f"hash seed {info.hash_seed} != {hash_seed(info.model)} expected for {info.model!r}")
        expected = self.block_sizes.get(info.model, info.block_size)
        if info.block_size != expected:
            problems.append(f"block size {info.block_size} != {expected} used by the other {info.model!r} engines")
        return problems
