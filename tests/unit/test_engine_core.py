"""The synchronous engine core, the one store-lookup bookkeeping, and the engine's import layering."""

import ast
import collections
import pathlib

from kvroute.engine.core.block_manager import BlockManager
from kvroute.engine.core.engine_core import CoreConfig, EngineCore
from kvroute.engine.core.sequence import SeqStatus, Sequence
from kvroute.engine.core.work import RunnerInfo, SamplingParams
from kvroute.engine.kv.config import TierConfig
from kvroute.engine.kv.tier_setup import TierSite, build_tiers
from kvroute.loadgen.sim.tiers import SimStore, SimTierIO
from kvroute.router.contract.protocol import block_hashes

BS = 4
SEED = 5
INFO = RunnerInfo("m", 100, 4096, None, "float32", 2, 2, 64)
ROOT = pathlib.Path(__file__).resolve().parents[2]


def make_core(num_blocks=16, max_waiting=8):
    bm = BlockManager(num_blocks, BS)
    config = CoreConfig(instance="e0", max_batched_tokens=64, max_running=4, max_waiting=max_waiting,
                        max_model_len=4096)
    return EngineCore(config, bm, frozenset())


def seq(tokens, max_tokens=2, request_id="r"):
    return Sequence(request_id, list(tokens), SamplingParams(max_tokens=max_tokens), SEED)


def test_a_request_runs_through_begin_and_finish_step():
    core = make_core()
    s = seq(range(10, 19), max_tokens=2)
    core.add(s)
    outcomes = []
    while core.has_work():
        start = core.begin_step()
        assert start.step.seqs == [s] and not start.dropped
        end = core.finish_step(start.step, [7] * len(start.step.seqs))
        outcomes.append(end.advanced)
    assert outcomes == [[s], [s]] and s.status == SeqStatus.FINISHED and s.finish_reason == "length"
    assert s.output_ids == [7, 7]
    kinds = [ev.kind for ev in core.drain_events()]
    assert kinds == ["stored"]  # the prompt's two full blocks, in one event


def test_load_record_counts_remote_prefills_in_waiting():
    core = make_core()
    core.add(seq(range(10, 19)))
    record = core.load_record(ts=1.5, remote_waiting=3, role="decode")
    assert (record.waiting, record.running, record.ts, record.role) == (4, 0, 1.5, "decode")
    assert record.kv_total_blocks == 16 and record.kv_free_blocks == 16 and record.instance == "e0"


def test_progress_counts_every_token_a_finished_step_computed():
    core = make_core()
    core.add(seq(range(10, 19), max_tokens=3, request_id="a"))
    core.add(seq(range(30, 43), max_tokens=3, request_id="b"))
    assert core.load_record(ts=0.0).progress == 0
    expected = 0
    while core.has_work():
        start = core.begin_step()
        assert core.load_record(ts=0.0).progress == expected  # a step in flight has not progressed yet
        core.finish_step(start.step, [7] * len(start.step.seqs))
        expected += sum(start.step.num_tokens)
        assert core.load_record(ts=0.0).progress == expected
    assert expected == 9 + 13 + 2 * 2  # both prompts, then two decode tokens each (the first came with the prefill)


def test_queue_full_and_a_prompt_that_never_fits():
    core = make_core(num_blocks=2, max_waiting=1)
    big = seq(range(10, 30))  # 5 blocks, the pool has 2
    core.add(big)
    assert core.queue_full
    assert not core.begin_step().step.seqs
    assert core.unschedulable(held=True) == []  # held blocks will come back: wait
    assert core.unschedulable() == [big] and big.is_finished and not core.has_work()


def test_block_records_are_made_on_first_use():
    bm = BlockManager(1024, BS)
    assert bm.blocks.count(None) == 1024 and bm.num_free == 1024
    s = seq(range(10, 19))
    hits = bm.match_prefix(s)
    bm.allocate(s, hits)
    assert sum(b is not None for b in bm.blocks) == 3 and bm.num_used == 3


def test_the_cached_hash_chain_is_the_prompts_block_hashes():
    core = make_core()
    s = seq(range(10, 23), max_tokens=4)
    core.add(s)
    while core.has_work():
        step = core.begin_step().step
        core.finish_step(step, [9] * len(step.seqs))
    assert s.hash_chain == block_hashes(s.token_ids, BS, SEED)[:len(s.hash_chain)]
    assert len(s.hash_chain) == len(s.token_ids) // BS


def store_tiers():
    return build_tiers(TierConfig(kv_store="redis://sim"), TierSite(model="m", block_size=BS), INFO, 1000, 10_000.0)


def test_store_lookup_bookkeeping():
    tiers = store_tiers()
    tiers.known.add(3)
    tiers.known.add(4)
    hits, removed = tiers.looked_up([1, 3, 4], [True, False, True], misses_known=True)
    assert hits == {1, 4} and 1 in tiers.known and 3 not in tiers.known
    assert removed.kind == "removed" and removed.blocks == [3] and removed.tier == "remote"
    assert removed.store == tiers.store_key and removed.store
    tiers.known.add(3)
    hits, removed = tiers.looked_up([3], [False], misses_known=False)  # the store is down: no news
    assert hits == frozenset() and removed is None and 3 in tiers.known


def test_the_simulated_store_lookup_books_like_the_engine():
    tiers = store_tiers()
    bm = BlockManager(8, BS, tiers)
    store = SimStore()
    published = []
    io = SimTierIO(tiers, bm.missing_hashes, _Runner(), store, lambda at, fn: None, published.extend, lambda: None)
    s = seq(range(10, 23))
    hashes = block_hashes(s.token_ids[:12], BS, SEED)
    store.blocks.update(hashes[:2])
    tiers.known.add(hashes[2])  # written by this engine, not landed in the store yet
    assert io.lookup_delay(s) > 0
    assert s.store_hits == set(hashes[:2]) and all(h in tiers.known for h in hashes[:2])
    assert [(ev.kind, ev.blocks, ev.tier) for ev in published] == [("removed", [hashes[2]], "remote")]


class _Runner:
    store_link = (1e9, 1e-4)
    time_scale = 1.0


def _imports(path: pathlib.Path, module: str, modules: set[str]) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):  # function-level and TYPE_CHECKING imports count
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module + "." + a.name for a in node.names] + [node.module] \
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def test_engine_has_no_import_cycles_and_core_stays_below_service_and_transfer():
    paths = {}
    for path in (ROOT / "engine").rglob("*.py"):
        name = "kvroute." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
        paths[name.removesuffix(".__init__")] = path
    edges = {m: _imports(p, m, set(paths)) for m, p in paths.items()}
    for m, targets in edges.items():
        if m.startswith("kvroute.engine.core"):
            assert not {t for t in targets if t.startswith(("kvroute.engine.service", "kvroute.engine.transfer"))}, m
    state: dict[str, int] = collections.defaultdict(int)  # 0 new, 1 on the path, 2 done

    def visit(m, path):
        state[m] = 1
        for t in edges.get(m, ()):
            assert state[t] != 1, f"import cycle: {' -> '.join(path + [t])}"
            if state[t] == 0:
                visit(t, path + [t])
        state[m] = 2

    for m in edges:
        if state[m] == 0:
            visit(m, [m])
