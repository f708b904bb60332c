"""The router's decision in process: prepare (limits, tokenize, hash) and decide (lookup, candidates, kv_aware
scoring), by prompt and fleet size (kvroute/benchmarks/router/__init__.py says what each row means)."""

from __future__ import annotations

import dataclasses
import statistics
import time

from kvroute.loadgen.redis_server import RedisServer

WORDS = "the router hashes blocks of tokens and sends each request where its prefix is cached".split()


def text_of(tokens_wanted: int, tokenizer) -> str:
    words, text = [], ""
    i = 0
    while True:
        words.append(WORDS[i % len(WORDS)] + str(i % 97))
        i += 1
        if i % 64 == 0:
            text = " ".join(words)
            if len(tokenizer.encode(text)) >= tokens_wanted:
                return text


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def make_router(tok, index, n_inst: int, max_model_len: int = 131072):
    from kvroute.router.contract.protocol import hash_seed
    from kvroute.router.decision.policies import make_policy
    from kvroute.router.fleet.cluster import Cluster
    from kvroute.router.fleet.instance import EngineInfo
    from kvroute.router.service.config import RouterConfig
    from kvroute.router.service.metrics import RouterMetrics
    from kvroute.router.service.routing import Router

    model = "kvroute-tiny"
    urls = tuple(f"http://127.0.0.1:{9000 + i}" for i in range(n_inst))
    cluster = Cluster(RouterConfig(engines=urls), index, tok.fingerprint, RouterMetrics())
    for i, inst in enumerate(cluster.instances):
        inst.info = EngineInfo(f"e{i}", model, 16, hash_seed(model), tok.fingerprint, max_model_len=max_model_len,
                               vocab_size=tok.vocab_size)
        inst.healthy = inst.reachable = True
    cluster.check_compatibility()
    return Router(cluster, make_policy("kv_aware"), tok, RouterMetrics(), "kv_aware")


class _Read:
    """A tokenizers.Encoding whose ids were read (a Python list made) inside the timed call."""

    def __init__(self, encoding) -> None:
        self.encoding, self.ids = encoding, encoding.ids

    def __getattr__(self, name):
        return getattr(self.encoding, name)


class TimedBackend:
    """A tokenizers.Tokenizer that adds the time spent in its encode calls, reading their ids
    included (what `tokenizer.encode(text).ids` costs a caller), to `seconds`."""

    def __init__(self, backend) -> None:
        self.backend, self.seconds = backend, 0.0

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def encode(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return _Read(self.backend.encode(*args, **kwargs))
        finally:
            self.seconds += time.perf_counter() - t0

    def encode_batch_fast(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return [_Read(e) for e in self.backend.encode_batch_fast(*args, **kwargs)]
        finally:
            self.seconds += time.perf_counter() - t0


def timed_tokenizer(tok):
    """`tok` with every encode it does (in full or through the segment cache) timed by one TimedBackend."""
    timed = TimedBackend(tok.backend)
    if tok.segments is not None:
        tok.segments.backend = timed
    return dataclasses.replace(tok, backend=timed), timed


async def hold_prefixes(index, ids: list[int], holders: int) -> None:
    """`holders` instances hold growing shares of the prompt's prefix; the rest hold nothing."""
    from kvroute.router.contract.protocol import block_hashes, hash_seed

    hashes = block_hashes(ids, 16, hash_seed("kvroute-tiny"))
    for i in range(holders):
        await index.add(f"e{i}", "device", hashes[: len(hashes) * (i + 1) // holders])


async def time_decisions(router, bodies, kind: str) -> tuple[list[float], list[float], list[float]]:
    """Per body: (prepare = limits + tokenize + hash, decide = lookup + candidates + score + the policy
    learning its choice, the part after the send: none since the decide stage records its choice
    before the request is sent, router/service/request_path.py), seconds."""
    prep, dec, after = [], [], []
    for body in bodies:
        t0 = time.perf_counter()
        prepared = await router.prepare(body, kind)
        t1 = time.perf_counter()
        choice = await router.decide(prepared, record=True)  # recorded before the send: nothing after it
        t2 = t3 = time.perf_counter()
        dec.append(t3 - t1)
        prep.append(t1 - t0)
        after.append(t3 - t2)
        router.policy.on_finished(prepared.route, choice.instance.id)
    return prep, dec, after


def scenario(name, index_name, n_inst, tokens, prep, dec, after, alone=None) -> dict:
    total = [a + b for a, b in zip(prep, dec)]
    row = {"scenario": name, "index": index_name, "instances": n_inst, "prompt_tokens": tokens,
           "median_ms": statistics.median(total) * 1e3, "p99_ms": pct(total, 0.99) * 1e3,
           "prepare_median_ms": statistics.median(prep) * 1e3, "decide_median_ms": statistics.median(dec) * 1e3,
           "after_send_median_ms": statistics.median(after) * 1e3}
    if alone is not None:
        row["tokenizer_alone_median_ms"] = statistics.median(alone) * 1e3
    print(f"{name:<34} {index_name:<6} {n_inst:>5} inst {tokens:>6} tok: median {row['median_ms']:.3f} ms "
          f"(prepare {row['prepare_median_ms']:.3f} + decide {row['decide_median_ms']:.3f}, of which "
          f"{row['after_send_median_ms']:.3f} after the send), "
          f"p99 {row['p99_ms']:.3f}" + (f", tokenizer alone {row['tokenizer_alone_median_ms']:.3f} ms"
                                         if alone else ""), flush=True)
    return row


def never_seen(name: str, index_name: str, tokens: int,
               runs: list[tuple[float, float, float, float, float]]) -> dict:
    """A never-seen row from (tokenizer alone, inside its calls, prepare, decide, after the send) per prompt."""
    alone, inside, prep, dec, after = map(list, zip(*runs))
    row = scenario(name, index_name, 64, tokens, prep, dec, after, alone)
    row["tokenizer_inside_median_ms"] = statistics.median(inside) * 1e3
    row["own_median_ms"] = statistics.median(p + d - i for p, d, i in zip(prep, dec, inside)) * 1e3
    row["over_tokenizer_median_ms"] = statistics.median(p + d - a for p, d, a in zip(prep, dec, alone)) * 1e3
    print(f"{'':<34} the router's own work (outside its encode calls): median {row['own_median_ms']:.3f} ms; "
          f"per pair, over the tokenizer alone: median {row['over_tokenizer_median_ms']:+.3f} ms", flush=True)
    return row


async def decision(args) -> dict:
    from kvroute.router.contract.tokenizer import DATA_DIR, load_tokenizer
    from kvroute.router.index import make_index

    redis = RedisServer()
    rows = []
    try:
        for index_name in ("memory", "redis"):
            for n_tokens in (8192, 32768):  # a chat whose long system prompt was seen before
                tok = load_tokenizer(DATA_DIR)  # fresh cache
                index = make_index(index_name, url=redis.url)
                router = make_router(tok, index, 64)
                system = {"role": "system", "content": text_of(n_tokens, tok)}
                first = [system, {"role": "user", "content": "question 0"}]
                await hold_prefixes(index, tok.encode_chat(first), 8)
                await router.prepare({"messages": first, "max_tokens": 1}, "chat")  # the system prompt is seen
                bodies = [{"messages": [system, {"role": "user", "content": f"question {i} about caches"}],
                           "max_tokens": 1} for i in range(args.reps)]
                prep, dec, after = await time_decisions(router, bodies, "chat")
                rows.append(scenario("chat, system prompt seen before", index_name, 64,
                                     len(tok.encode_chat(bodies[0]["messages"])), prep, dec, after))
                await index.close()
            tok, timed = timed_tokenizer(load_tokenizer(DATA_DIR))
            index = make_index(index_name, url=redis.url)
            router = make_router(tok, index, 64)
            texts = [f"fresh prompt {i}: " + text_of(8192, tok) for i in range(2 * args.reps)]
            places: dict[str, list] = {"in place": [], "through the pool": []}  # per prompt: (alone, inside, ...)
            in_place = router.pool.idle_inline_chars
            for i, t in enumerate(texts):  # interleaved: both sides see the same machine
                place = "through the pool" if i % 2 else "in place"  # an idle router tokenizes in place
                router.pool.idle_inline_chars = 0 if i % 2 else in_place
                t0 = time.perf_counter()
                timed.backend.encode_batch_fast([t], add_special_tokens=False)  # the tokenizer's fastest call
                alone = time.perf_counter() - t0
                before = timed.seconds
                p, d, a = await time_decisions(router, [{"prompt": t, "max_tokens": 1}], "completion")
                places[place].append((alone, timed.seconds - before, p[0], d[0], a[0]))
            for place, runs in places.items():
                rows.append(never_seen(f"completion, never seen, {place}", index_name, len(tok.encode(texts[0])),
                                       runs))
            await index.close()
        for n_inst in (64, 1024):  # a 1k-token prompt, holders among many instances (memory index)
            tok = load_tokenizer(DATA_DIR)
            index = make_index("memory")
            router = make_router(tok, index, n_inst)
            base = text_of(1024, tok)
            await hold_prefixes(index, tok.encode(base), 8)
            ids = [[*tok.encode(base), 5 + i % 50, 6, 7] for i in range(args.reps)]
            prep, dec, after = await time_decisions(router, [{"prompt": p, "max_tokens": 1} for p in ids], "completion")
            rows.append(scenario("token ids, 8 holders", "memory", n_inst, len(ids[0]), prep, dec, after))
    finally:
        redis.stop()
    return {"decision": rows}
