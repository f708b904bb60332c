"""The hot path's caches change no decision: recorded bench requests replayed through a router
with the tokenize and hash caches and through one without give the same ids, hashes and
choices (router/contract/segment_cache.py, router/decision/prefix_hashes.py, cached Instance.state)."""

import dataclasses
import random

from kvroute.loadgen.workloads import make_workload
from kvroute.router.contract.protocol import hash_seed
from kvroute.router.contract.tokenizer import DATA_DIR, load_tokenizer
from kvroute.router.decision.policies import make_policy
from kvroute.router.decision.prefix_hashes import PrefixHashes
from kvroute.router.fleet.cluster import Cluster
from kvroute.router.fleet.instance import EngineInfo
from kvroute.router.index import MemoryIndex
from kvroute.router.service.config import RouterConfig
from kvroute.router.service.metrics import RouterMetrics
from kvroute.router.service.routing import Router

MODEL = "kvroute-tiny"


def build(tok, clock, caches: bool) -> Router:
    urls = tuple(f"http://127.0.0.1:{9000 + i}" for i in range(16))
    cluster = Cluster(RouterConfig(engines=urls), MemoryIndex(), tok.fingerprint, RouterMetrics())
    for i, inst in enumerate(cluster.instances):
        inst.info = EngineInfo(f"e{i}", MODEL, 16, hash_seed(MODEL), tok.fingerprint, max_model_len=32768,
                               vocab_size=tok.vocab_size)
        inst.healthy = inst.reachable = True
    cluster.check_compatibility()
    policy = make_policy("kv_aware", rng=random.Random(0), clock=clock)
    router = Router(cluster, policy, tok, RouterMetrics(), "kv_aware")
    if not caches:
        router.hashes = PrefixHashes(max_hashes=1)  # remembers nothing: every prompt hashed in full
    return router


def recorded_bodies(tok) -> list[tuple[dict, str]]:
    """The bench's workloads as clients send them: chats with a shared system prompt, growing
    conversations, and text completions that carry special tokens."""
    out = []
    for spec in make_workload("shared-prefix", seed=1, num_requests=120, groups=4, prefix_tokens=600,
                              question_tokens=40).requests():
        system, question = tok.decode(spec.prompt_ids[:600]), tok.decode(spec.prompt_ids[600:])
        out.append(({"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
                     "max_tokens": 8}, "chat"))
    specs = make_workload("multi-turn", seed=2, num_requests=80, turns=4, system_tokens=300,
                          question_tokens=60, answer_tokens=30).requests()
    for spec in specs:
        before = specs[spec.after].prompt_ids if spec.after is not None else spec.prompt_ids[:300]
        turns = [{"role": "system", "content": tok.decode(before)},
                 {"role": "user", "content": tok.decode(spec.prompt_ids[len(before):])}]
        out.append(({"messages": turns, "max_tokens": 8}, "chat"))
    rng = random.Random(3)
    shared = tok.decode(specs[0].prompt_ids)
    for i in range(80):
        special = rng.choice(["<|im_start|>", "<|im_end|>", ""])
        out.append(({"prompt": f"{shared}{special}request {i} {special}", "max_tokens": 8}, "completion"))
    return out


async def replay(router: Router, bodies, now: list[float]) -> list[tuple]:
    trail = []
    for body, kind in bodies:
        prepared = await router.prepare(body, kind)
        choice = await router.decide(prepared)
        inst = choice.instance.id
        route = prepared.route
        trail.append((inst, prepared.token_ids, route.block_hashes, round(choice.decision.costs[inst], 12)))
        await router.cluster.index.add(inst, "device", route.block_hashes)  # the engine caches the prompt
        router.policy.on_first_token(route, inst, 0.05, choice.uncached_tokens)
        router.policy.on_finished(route, inst)
        now[0] += 0.05
    return trail


async def test_the_caches_change_no_decision():
    cached_tok = load_tokenizer(DATA_DIR)
    plain_tok = dataclasses.replace(load_tokenizer(DATA_DIR), segments=None)
    assert cached_tok.segments is not None
    bodies = recorded_bodies(load_tokenizer(DATA_DIR))
    now_a, now_b = [0.0], [0.0]
    with_caches = build(cached_tok, lambda: now_a[0], caches=True)
    without = build(plain_tok, lambda: now_b[0], caches=False)
    a = await replay(with_caches, bodies, now_a)
    b = await replay(without, bodies, now_b)
    assert [row[1] for row in a] == [row[1] for row in b]  # token ids
    assert [row[2] for row in a] == [row[2] for row in b]  # block hashes
    assert [(row[0], row[3]) for row in a] == [(row[0], row[3]) for row in b]  # choices and their costs
    assert len({row[0] for row in a}) > 3  # the replay spread over the fleet: decisions were made
    assert cached_tok.segments.hits > 150 and with_caches.hashes.hits > 150  # and the caches were used
