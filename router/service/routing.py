"""The per-request decision: parse, tokenize, hash, look up, score.

`Router.prepare` turns a body into a `Prepared` request (validated, tokenized,
hashed); `Router.decide` picks an instance among the routable ones. Both are used
by the proxy and by POST /router/explain, so the explanation is the decision.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import msgspec

from kvroute.router.contract.block_keys import NO_KEYS, RequestKeys
from kvroute.router.contract.encoding import Encoding
from kvroute.router.contract.errors import BadRequest, NotFound, Overloaded, Unavailable
from kvroute.router.contract.limits import check_prompt_chars, check_token_count, check_vocabulary
from kvroute.router.contract.openai_request import CompletionRequest, parse_request
from kvroute.router.contract.protocol import hash_seed
from kvroute.router.contract.tokenize_pool import TokenizePool
from kvroute.router.contract.tokenizer import Tokenizer
from kvroute.router.decision.admission import NO_PREDICTION, Prediction, predicted_ttft
from kvroute.router.decision.base import COST_TERMS, Decision, Policy, RouteRequest
from kvroute.router.decision.prefix_hashes import PrefixHashes
from kvroute.router.decision.route import NoCandidates, Routed, RouteDecision, RouteSettings, uncached_tokens
from kvroute.router.decision.scoring.tier_credit import with_store
from kvroute.router.decision.tenants import DEFAULT_TENANT
from kvroute.router.fleet import model_keys
from kvroute.router.fleet.cluster import Cluster
from kvroute.router.fleet.groups import Group
from kvroute.router.fleet.instance import Instance
from kvroute.router.index.base import NO_MATCH, IndexUnavailable, PrefixMatch
from kvroute.router.service import request_keys
from kvroute.router.service.metrics import RouterMetrics
from kvroute.router.service.request_trace import RecentRequests, RequestTrace
from kvroute.router.service.routing_loss import RoutingLoss

log = logging.getLogger(__name__)

_request_ids = itertools.count()


class Prepared(msgspec.Struct, frozen=True, kw_only=True):
    request: CompletionRequest
    model: str
    num_tokens: int
    route: RouteRequest
    started: float
    trace: RequestTrace
    token_ids: list[int] = msgspec.field(default_factory=list)
    keys: RequestKeys = NO_KEYS  # adapter, images, salt (router/contract/block_keys.py)


class Forecast(msgspec.Struct, frozen=True, kw_only=True):
    """A decision before its bookkeeping: the index's matches and the choice (admission predicts from it)."""

    routed: Routed
    matches: Mapping[str, PrefixMatch]

    @property
    def prediction(self) -> Prediction:
        return predicted_ttft(self.routed.decision)


class Choice(msgspec.Struct, frozen=True, kw_only=True):
    instance: Instance
    decision: Decision
    matches: Mapping[str, PrefixMatch]
    candidates: Sequence[Instance]
    prepared_tokens: int = 0

    @property
    def cached_tokens(self) -> int:
        assert self.instance.info is not None  # a chosen instance is routable: it has its info
        match = self.matches.get(self.instance.id, NO_MATCH) if self.instance.cache_ok else NO_MATCH
        return match.tokens(self.instance.info.block_size)

    @property
    def uncached_tokens(self) -> int:
        assert self.instance.info is not None  # a chosen instance is routable: it has its info
        return uncached_tokens(self.decision, self.instance.state(), self.matches, self.prepared_tokens,
                               self.instance.info.block_size)


class Router:
    def __init__(self, cluster: Cluster, policy: Policy, tokenizer: Tokenizer, metrics: RouterMetrics,
                 policy_name: str, pool: TokenizePool | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_progress: Callable[[], None] = lambda: None, loss: RoutingLoss | None = None) -> None:
        """`on_progress`: called when a dispatched request's prefill is seen done and when it ends
        (the admission gate's news, router/service/admission_gate.py). `loss`: the routing-loss split
        (router/service/routing_loss.py), fed when a request is decided and when it ends."""
        self.cluster = cluster
        self.on_progress = on_progress
        self.policy = policy
        self.policy_name = policy_name
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.pool = pool or TokenizePool()
        self.hashes = PrefixHashes()  # block hashes of cached prompt prefixes, reused
        self.recent = RecentRequests()  # finished requests, for GET /router/stats (the planner)
        self.loss = loss if loss is not None else RoutingLoss(metrics.registry)
        self.clock = clock  # the recent senders' (the policies have their own)
        cfg = cluster.config
        self.decision = RouteDecision(policy, RouteSettings(fast_candidates=cfg.fast_candidates,
                                                            recent_ttl_s=cfg.recent_ttl_s,
                                                            max_inflight=cfg.max_inflight))

    def resolve_model(self, requested: str | None) -> str:
        models = self.cluster.models()
        if requested is not None:
            if requested not in models:
                base = model_keys.adapter_base(self.cluster.instances, requested)
                if base is not None:  # a LoRA adapter of a served model
                    return base
                raise NotFound(f"model {requested!r} does not exist; served models: {', '.join(models) or 'none'}",
                               param="model", code="model_not_found")
            return requested
        if not models:
            raise Unavailable("no engine instance is available yet")
        return models[0]

    async def prepare(self, body: dict, kind: str, tenant: str = DEFAULT_TENANT) -> Prepared:
        """Validate, check limits, tokenize (off the loop when much is left to encode, the pool
        shared fairly by `tenant`), hash: in that order, so no work is done for a request that a
        cheaper check can refuse."""
        started = time.perf_counter()
        req = parse_request(body, kind)
        model = self.resolve_model(req.model)
        adapter = req.model if req.model is not None and req.model != model else None
        limits = self.cluster.limits_for(model)
        chars = check_prompt_chars(req, limits)
        messages, urls = request_keys.chat_messages(req, self.tokenizer) if req.messages is not None else (None, [])
        enc = await self._tokenize(req, chars, tenant, messages)
        enc, keys = request_keys.keyed(enc, req, adapter, urls, self.tokenizer, self.cluster.instances, model,
                                       self.metrics)
        ids = enc.ids
        check_token_count(len(ids), limits)
        if req.prompt_ids is not None:  # ids from this router's tokenizer are in its vocabulary
            check_vocabulary(enc.data, limits)
        block_size = self.cluster.block_size(model)
        hashes = request_keys.block_hashes(self.hashes, enc, block_size, model, keys, self.cluster.instances,
                                           hash_seed(model))
        route = RouteRequest(num_tokens=len(ids), block_hashes=tuple(hashes), block_size=block_size,
                             request_id=f"r{next(_request_ids)}", adapter=keys.adapter)
        asked = req.max_tokens if req.max_tokens is not None else 16 if req.kind == "completion" else -1
        trace = RequestTrace(model=model, stream=req.stream, prompt_tokens=len(ids), started=started,
                             max_tokens=asked)
        return Prepared(request=req, model=model, num_tokens=len(ids), route=route, started=started, trace=trace,
                        token_ids=ids, keys=keys)

    def finish(self, trace: RequestTrace, status: str) -> None:
        """A client request ended (answered, failed or abandoned): metrics and the recent window."""
        trace.end(status)
        end = trace.last_byte or time.perf_counter()
        self.metrics.observe_finished(trace.model, trace.instance or "none", end - trace.started, trace.usage,
                                      trace.first_token, trace.last_byte)
        self.recent.add(trace)
        self.loss.finished(trace)

    async def _tokenize(self, req: CompletionRequest, chars: int, tenant: str, messages: list | None) -> Encoding:
        """Look the prompt's pieces up here; encode what is missing inline or in the pool, by its size."""
        if req.prompt_ids is not None:
            return Encoding.of(req.prompt_ids, req.prompt_ids_le)
        try:
            if messages is not None:
                plan = self.tokenizer.plan_chat(messages)
            else:
                assert req.prompt is not None  # a completion has its text or its ids (returned above)
                plan = self.tokenizer.plan(req.prompt)
        except ValueError as e:
            raise BadRequest(str(e), param="messages" if req.messages is not None else "prompt") from None
        return await self.pool.run(plan.finish, chars=plan.missing_chars, idle=self.cluster.idle, tenant=tenant)

    async def decide(self, prepared: Prepared, exclude: Sequence[str] = (), record: bool = True,
                     roles: Sequence[str] | None = None, forecast: Forecast | None = None) -> Choice:
        """Pick among routable instances (of `roles`, if given) not in `exclude`: the index lookup
        here, the rest in `RouteDecision` (router/decision/route.py), the simulator's decision too.
        `record=False` (POST /router/explain) always shows every instance and records nothing;
        `record=True` records the choice at once (the policy, the recent senders), before the caller
        sends anything. `forecast`: the choice admission predicted from in this same event-loop step
        (nothing awaited since), taken as it is instead of looked up and chosen again."""
        group = self.group(prepared.model, roles)
        if self.decision.overloaded(group) and not exclude:
            raise self._overloaded()  # before the lookup it would waste
        try:
            if forecast is None or exclude or not record:
                forecast = await self._choose(prepared, group, exclude, fast=record)
        except NoCandidates as e:
            if e.overloaded:
                raise self._overloaded() from None
            raise Unavailable(f"no healthy instance serves {prepared.model!r} that was not tried already") from None
        routed, matches = forecast.routed, forecast.matches
        if record:
            self.decision.routed(prepared.route, routed.member.id, self.clock())
            self.decided(prepared)
        return self.choice(prepared, routed, matches)

    def observe_choice(self, prepared: Prepared, choice: Choice) -> None:
        """The cache metrics of a choice made for sending (the predicted cached tokens go on its trace),
        and its routing-loss figures (router/service/routing_loss.py) at decision time."""
        self.loss.decided(prepared.trace, choice, self.loss_matches(prepared, choice))
        cached = choice.cached_tokens
        prepared.trace.predicted_cached = cached
        self.metrics.prompt_tokens.inc(prepared.num_tokens)
        self.metrics.cached_tokens.inc(cached)
        self.metrics.cached_ratio.observe(cached / prepared.num_tokens if prepared.num_tokens else 0.0)

    async def forecast(self, prepared: Prepared, roles: Sequence[str] | None = None) -> Forecast | None:
        """The decision as it would be made now, without its bookkeeping (admission's prediction,
        router/decision/admission.py); None when nobody can take the request."""
        try:
            return await self._choose(prepared, self.group(prepared.model, roles))
        except NoCandidates:
            return None

    async def _choose(self, prepared: Prepared, group: Group, exclude: Sequence[str] = (),
                      fast: bool = True) -> Forecast:
        """The index lookup, then `RouteDecision.choose` (NoCandidates when nobody can take it)."""
        matches = self.lookup_now(prepared)
        if matches is None:
            matches = await self._lookup_awaited(prepared)
        return Forecast(routed=self.decision.choose(prepared.route, group, matches, self.clock(), exclude, fast=fast),
                        matches=matches)

    async def predict(self, prepared: Prepared, roles: Sequence[str] | None = None) -> Prediction:
        """The best candidate's predicted TTFT now; none when the policy predicts nothing or nobody
        can take the request."""
        forecast = await self.forecast(prepared, roles)
        return forecast.prediction if forecast is not None else NO_PREDICTION

    def group(self, model: str, roles: Sequence[str] | None) -> Group:
        group = self.cluster.group(model, roles)
        if not group.members:
            what = f" in role {'/'.join(roles)}" if roles else ""
            raise Unavailable(f"no healthy instance{what} serves {model!r}")
        return group

    def decided(self, prepared: Prepared) -> None:
        if not prepared.trace.decided:  # once per request, not per retry
            prepared.trace.decided = True
            self.metrics.decision_seconds.observe(time.perf_counter() - prepared.started)

    @staticmethod
    def choice(prepared: Prepared, routed: Routed, matches: Mapping[str, PrefixMatch]) -> Choice:
        return Choice(instance=routed.member, decision=routed.decision, matches=matches, candidates=routed.candidates,
                      prepared_tokens=prepared.num_tokens)

    def _overloaded(self) -> Overloaded:
        self.metrics.errors.labels("overloaded").inc()
        limit = self.cluster.config.max_inflight
        return Overloaded(f"every instance has {limit} requests in flight", retry_after=1, too_many=True)

    def loss_matches(self, prepared: Prepared, choice: Choice) -> Mapping[str, PrefixMatch] | None:
        """The index's matches for the routing-loss split: the decision's own, or for a policy that
        does not read the index a lookup where it needs no await (None: none)."""
        if self.policy.uses_index or not prepared.route.block_hashes:
            return choice.matches
        return self.cluster.index.lookup_now(prepared.route.block_hashes)

    def lookup_now(self, prepared: Prepared) -> Mapping[str, PrefixMatch] | None:
        """`lookup` when the index answers without awaiting (memory); None when it must be awaited."""
        if not prepared.route.block_hashes or not self.policy.uses_index:
            return {}
        t0 = time.perf_counter()
        matches = self.cluster.index.lookup_now(prepared.route.block_hashes)
        if matches is not None:
            self.metrics.lookup_seconds.observe(time.perf_counter() - t0)
        return matches

    async def lookup(self, prepared: Prepared) -> Mapping[str, PrefixMatch]:
        """The index's matches for the prompt ({} for policies that do not read the index)."""
        matches = self.lookup_now(prepared)
        return matches if matches is not None else await self._lookup_awaited(prepared)

    async def _lookup_awaited(self, prepared: Prepared) -> Mapping[str, PrefixMatch]:
        """The lookup of an index that must be awaited (Redis); {} when it is unavailable."""
        t0 = time.perf_counter()
        try:
            matches = await self.cluster.index.lookup(prepared.route.block_hashes)
        except IndexUnavailable as e:
            log.warning("index lookup failed, routing on load alone: %s", e)
            self.metrics.errors.labels("index").inc()
            prepared.trace.index_blind = True  # its prediction says nothing of the keys (silent_miss_alarms.py)
            return {}
        self.metrics.lookup_seconds.observe(time.perf_counter() - t0)
        return matches

    def explain(self, prepared: Prepared, choice: Choice) -> dict:
        rows, terms = [], choice.decision.terms
        for inst in choice.candidates:
            assert inst.info is not None  # a candidate is routable: it has its info
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
                "match": request_keys.match_note(prepared.keys, match.tokens(inst.info.block_size)
                                                 if inst.cache_ok else 0, inst.info),
                "cost": choice.decision.costs.get(inst.id),
                "cost_terms": dict(zip(COST_TERMS, terms[inst.id])) if inst.id in terms else None,
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
            "keys": request_keys.explain(prepared.keys, model_keys.key_rule(self.cluster.instances, prepared.model),
                                         len(prepared.route.block_hashes), prepared.num_tokens,
                                         prepared.route.block_size),
            "choice": choice.instance.id,
            "reason": choice.decision.explained(),
            "predicted_cached_tokens": choice.cached_tokens,
            "instances": rows,
        }
