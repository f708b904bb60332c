"""The per-request decision: parse, tokenize, hash, look up, score.

`Router.prepare` turns a body into a `Prepared` request (validated, tokenized,
hashed); `Router.decide` picks an instance among the routable ones. Both are used
by the proxy and by POST /router/explain, so the explanation is the decision.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from typing import Mapping, Sequence

from router.cluster import Cluster
from router.errors import BadRequest, NotFound, Overloaded, Unavailable
from router.index.base import NO_MATCH, IndexUnavailable, PrefixMatch
from router.instance import Instance
from router.metrics import RouterMetrics
from router.openai_request import CompletionRequest, parse_request
from router.policies.base import Decision, Policy, RouteRequest
from router.policies.tier_credit import with_store
from router.protocol import block_hashes, hash_seed
from router.tokenizer import Tokenizer

log = logging.getLogger(__name__)

THREAD_TOKENIZE_CHARS = 8_000  # longer prompts are tokenized off the event loop
_request_ids = itertools.count()


@dataclasses.dataclass(frozen=True, slots=True)
class Prepared:
    request: CompletionRequest
    model: str
    num_tokens: int
    route: RouteRequest
    started: float


@dataclasses.dataclass(frozen=True, slots=True)
class Choice:
    instance: Instance
    decision: Decision
    matches: Mapping[str, PrefixMatch]
    candidates: Sequence[Instance]
    prepared_tokens: int = 0

    @property
    def cached_tokens(self) -> int:
        match = self.matches.get(self.instance.id, NO_MATCH) if self.instance.cache_ok else NO_MATCH
        return match.tokens(self.instance.info.block_size)

    @property
    def uncached_tokens(self) -> int:
        if self.decision.uncached_tokens is not None:
            return self.decision.uncached_tokens
        return max(0, self.prepared_tokens - self.cached_tokens)


class Router:
    def __init__(self, cluster: Cluster, policy: Policy, tokenizer: Tokenizer, metrics: RouterMetrics,
                 policy_name: str) -> None:
        self.cluster = cluster
        self.policy = policy
        self.policy_name = policy_name
        self.tokenizer = tokenizer
        self.metrics = metrics

    def resolve_model(self, requested: str | None) -> str:
        models = self.cluster.models()
        if requested is not None:
            if requested not in models:
                raise NotFound(f"model {requested!r} does not exist; served models: {', '.join(models) or 'none'}",
                               param="model", code="model_not_found")
            return requested
        if not models:
            raise Unavailable("no engine instance is available yet")
        return models[0]

    async def prepare(self, body: dict, kind: str) -> Prepared:
        started = time.perf_counter()
        req = parse_request(body, kind)
        model = self.resolve_model(req.model)
        ids = await self._tokenize(req)
        block_size = self.cluster.block_size(model)
        hashes = block_hashes(ids, block_size, hash_seed(model, req.cache_salt))
        route = RouteRequest(len(ids), tuple(hashes), block_size, request_id=f"r{next(_request_ids)}")
        return Prepared(req, model, len(ids), route, started)

    async def _tokenize(self, req: CompletionRequest) -> list[int]:
        try:
            if req.prompt_ids is not None:
                return list(req.prompt_ids)
            if req.messages is not None:
                return self.tokenizer.encode_chat(list(req.messages))
            if len(req.prompt) > THREAD_TOKENIZE_CHARS:
                return await asyncio.to_thread(self.tokenizer.encode, req.prompt)
            return self.tokenizer.encode(req.prompt)
        except ValueError as e:
            raise BadRequest(str(e), param="messages" if req.messages is not None else "prompt") from None

    async def decide(self, prepared: Prepared, exclude: Sequence[str] = (), record: bool = True,
                     roles: Sequence[str] | None = None) -> Choice:
        """Pick among routable instances (of `roles`, if given) not in `exclude`."""
        candidates = [i for i in self.cluster.routable(prepared.model, roles) if i.id not in exclude]
        if not candidates:
            what = f" in role {'/'.join(roles)}" if roles else ""
            raise Unavailable(f"no healthy instance{what} serves {prepared.model!r}")
        limit = self.cluster.config.max_inflight
        if limit:
            candidates = [i for i in candidates if i.inflight < limit]
            if not candidates:
                self.metrics.errors.labels("overloaded").inc()
                raise Overloaded(f"every instance has {limit} requests in flight", retry_after=1, too_many=True)
        matches = await self._lookup(prepared) if self.policy.uses_index else {}
        decision = self.policy.select(prepared.route, [i.state() for i in candidates], matches)
        chosen = next(i for i in candidates if i.id == decision.instance)
        if record:
            self.policy.on_routed(prepared.route, chosen.id)
            self.metrics.decision_seconds.observe(time.perf_counter() - prepared.started)
        return Choice(chosen, decision, matches, candidates, prepared_tokens=prepared.num_tokens)

    async def _lookup(self, prepared: Prepared) -> Mapping[str, PrefixMatch]:
        if not prepared.route.block_hashes:
            return {}
        t0 = time.perf_counter()
        try:
            matches = await self.cluster.index.lookup(prepared.route.block_hashes)
        except IndexUnavailable as e:
            log.warning("index lookup failed, routing on load alone: %s", e)
            self.metrics.errors.labels("index").inc()
            return {}
        self.metrics.lookup_seconds.observe(time.perf_counter() - t0)
        return matches

    def explain(self, prepared: Prepared, choice: Choice) -> dict:
        rows = []
        for inst in choice.candidates:
            match = choice.matches.get(inst.id, NO_MATCH)
            by_tier = with_store(match, choice.matches, inst.tier_costs) if inst.cache_ok else {}
            rows.append({
                "instance": inst.id,
                "url": inst.url,
                "cached_tokens": match.tokens(inst.info.block_size) if inst.cache_ok else 0,
                "cached_blocks_by_tier": dict(match.by_tier),
                "cached_tokens_by_tier": {t: n * inst.info.block_size for t, n in by_tier.items()},
                **self.policy.credit_detail(inst.id),
                "cache_ok": inst.cache_ok,
                "cost": choice.decision.costs.get(inst.id),
                "inflight": inst.inflight,
                "queued_prefill_tokens": inst.queued_prefill_tokens,
                "load": inst.load.to_dict() if inst.load else None,
            })
        return {
            "policy": self.policy_name,
            "model": prepared.model,
            "prompt_tokens": prepared.num_tokens,
            "blocks": len(prepared.route.block_hashes),
            "block_size": prepared.route.block_size,
            "choice": choice.instance.id,
            "reason": choice.decision.reason,
            "predicted_cached_tokens": choice.cached_tokens,
            "instances": rows,
        }
