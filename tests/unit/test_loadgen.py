"""kvroute loadgen: workloads, arrivals, client timing, summaries, reports and the CLI (real loopback servers)."""

import asyncio
import gzip
import json
import pathlib
import socket

import numpy as np
import orjson
import pytest
from aiohttp import web

from kvroute.loadgen.arrivals import ArrivalConfig, arrival_times, count_within
from kvroute.loadgen.cli import main
from kvroute.loadgen.record import RequestRecord
from kvroute.loadgen.report import Run, write_report
from kvroute.loadgen.runner import LoadConfig, run_load
from kvroute.loadgen.summary import summarize
from kvroute.loadgen.workloads import WORKLOADS, make_workload
from kvroute.loadgen.workloads.content import FIRST_ID, VOCAB_SIZE
from tests.support.loopback import LoopbackServer


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@pytest.fixture
def trace_file(tmp_path):
    lines = [
        {"timestamp": 1000, "input_length": 1500, "output_length": 7, "hash_ids": [1, 2, 3]},
        {"timestamp": 1500, "input_length": 1400, "output_length": 900, "hash_ids": [1, 2, 4]},
        {"timestamp": 2000, "input_length": 512, "output_length": 3, "hash_ids": [5]},
        {"timestamp": 4000, "input_length": 1536, "output_length": 5, "hash_ids": [1, 2, 3]},
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def small_workloads(trace_file):
    return {
        "shared-prefix": ("shared-prefix", {"num_requests": 24, "groups": 3, "prefix_tokens": 64,
                                            "question_tokens": 8}),
        "multi-turn": ("multi-turn", {"num_requests": 12, "turns": 3, "question_tokens": 8, "answer_tokens": 4}),
        "doc-qa": ("doc-qa", {"num_requests": 30, "documents": 4, "doc_tokens": 48, "question_tokens": 6}),
        "random": ("random", {"num_requests": 20, "input_tokens": 40}),
        "shift": ("shift", {"num_requests": 20, "prompt_heavy_input_tokens": 60, "decode_heavy_output_tokens": 30}),
        "session-storm": ("session-storm", {"sessions": 4, "context_tokens": 48, "min_context_tokens": 32,
                                            "question_tokens": 4, "idle_requests": 3, "idle_tokens": 16, "burst": 3}),
        "trace": ("trace:" + trace_file, {"trace_block_tokens": 16}),
    }


# --- workloads ---------------------------------------------------------------------------------

def test_every_workload_is_deterministic_for_a_seed(trace_file):
    cases = small_workloads(trace_file)
    assert set(cases) == set(WORKLOADS)
    for name, knobs in cases.values():
        first = make_workload(name, seed=7, **knobs).requests()
        assert first == make_workload(name, seed=7, **knobs).requests(), name
        assert first != make_workload(name, seed=8, **knobs).requests(), name
        assert [s.index for s in first] == list(range(len(first)))
        ids = np.concatenate([s.prompt_ids for s in first])
        assert ids.min() >= FIRST_ID and ids.max() < VOCAB_SIZE, name


def test_shift_changes_shape_half_way():
    specs = make_workload("shift", seed=1, num_requests=100).requests()
    heavy, light = specs[:50], specs[50:]
    assert {s.group for s in heavy} == {"prompt-heavy"} and {s.group for s in light} == {"decode-heavy"}
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert mean([len(s.prompt_ids) for s in heavy]) > 5 * mean([len(s.prompt_ids) for s in light])
    assert mean([s.max_tokens for s in light]) > 10 * mean([s.max_tokens for s in heavy])
    assert len({s.prompt_ids[0] for s in specs}) == 100  # nothing shared
def test_session_storm_returns_extend_their_first_turn_after_the_idle_traffic():
    specs = make_workload("session-storm", seed=3, sessions=6, context_tokens=40, min_context_tokens=20,
                          question_tokens=5, answer_tokens=3, idle_requests=4, idle_tokens=10, burst=4,
                          burst_spread=1.0, gap=2.0).requests()
    first = {s.group: s for s in specs if s.group.startswith("session-")}
    returns = [s for s in specs if s.group.startswith("return-")]
    idle = [s for s in specs if s.group == "idle"]
    assert len(first) == 6 and len(returns) == 4 and len(idle) == 4
    assert all(20 <= len(s.prompt_ids) <= 40 for s in first.values())
    assert [s.arrival_s for s in specs] == sorted(s.arrival_s for s in specs)
    assert max(s.arrival_s for s in first.values()) < min(s.arrival_s for s in idle)
    assert max(s.arrival_s for s in idle) + 2.0 <= min(s.arrival_s for s in returns)
    assert max(s.arrival_s for s in returns) - min(s.arrival_s for s in returns) <= 1.0
    for r in returns:
        turn1 = first["session-" + r.group.split("-")[1]].prompt_ids
        assert r.prompt_ids[:len(turn1)] == turn1 and len(r.prompt_ids) == len(turn1) + 8
    with pytest.raises(ValueError, match="--burst"):
        make_workload("session-storm", sessions=2, burst=3)


def test_shared_prefix_groups_share_exactly_the_prefix():
    specs = make_workload("shared-prefix", seed=1, num_requests=40, groups=4, prefix_tokens=100,
                          question_tokens=10, output_tokens=5).requests()
    assert {s.group for s in specs} == {f"group-{g}" for g in range(4)}
    assert all(len(s.prompt_ids) == 110 and s.max_tokens == 5 for s in specs)
    for a in specs:
        for b in specs:
            if a.index < b.index:
                expected = 100 if a.group == b.group else 0
                assert common_prefix(a.prompt_ids, b.prompt_ids) == expected


def test_doc_qa_shares_documents_with_zipf_popularity():
    specs = make_workload("doc-qa", seed=2, num_requests=300, documents=5, doc_tokens=50, question_tokens=5,
                          zipf=1.2).requests()
    for a, b in zip(specs, specs[1:]):
        assert common_prefix(a.prompt_ids, b.prompt_ids) == (50 if a.group == b.group else 0)
    counts = {g: sum(s.group == g for s in specs) for g in {s.group for s in specs}}
    assert max(counts, key=counts.get) == "doc-0" and counts["doc-0"] > counts.get("doc-4", 0)


def test_multi_turn_prompts_grow_and_chain():
    specs = make_workload("multi-turn", seed=3, num_requests=10, turns=4, system_tokens=6, question_tokens=8,
                          answer_tokens=5, think_time=0.5).requests()
    assert [s.group for s in specs] == ["session-0"] * 4 + ["session-1"] * 4 + ["session-2"] * 2
    for prev, spec in zip(specs, specs[1:]):
        if spec.group == prev.group:
            assert spec.after == prev.index and spec.think_s == 0.5
            assert spec.prompt_ids[: len(prev.prompt_ids)] == prev.prompt_ids
            assert len(spec.prompt_ids) == len(prev.prompt_ids) + 5 + 8
        else:
            assert spec.after is None and common_prefix(spec.prompt_ids, prev.prompt_ids) == 6  # system prompt


def test_random_shares_no_first_block():
    specs = make_workload("random", seed=4, num_requests=200, input_tokens=32).requests()
    assert len({s.prompt_ids[:16] for s in specs}) == 200
    assert len({s.prompt_ids[0] for s in specs}) == 200


def test_trace_hash_ids_map_to_shared_content(trace_file):
    workload = make_workload("trace:" + trace_file, seed=0, trace_block_tokens=16, trace_time_scale=0.5,
                             trace_max_output=100)
    a, b, c, d = workload.requests()
    assert common_prefix(a.prompt_ids, b.prompt_ids) == 32  # hash ids [1, 2] in common: exactly 2 blocks
    assert a.prompt_ids == d.prompt_ids[: len(a.prompt_ids)] and len(d.prompt_ids) == 48
    assert len(a.prompt_ids) == 47 and len(c.prompt_ids) == 16  # ceil(1500 * 16 / 512), 512 * 16 / 512
    assert common_prefix(a.prompt_ids, c.prompt_ids) == 0
    assert [s.arrival_s for s in (a, b, c, d)] == [0.0, 0.25, 0.5, 1.5]
    assert [s.max_tokens for s in (a, b, c, d)] == [7, 100, 3, 5]
    info = workload.info()
    assert info["block_tokens"] == 16 and info["token_scale"] == 16 / 512 and info["capped_outputs"] == 1
    capped = make_workload("trace:" + trace_file, num_requests=2, trace_block_tokens=16, trace_max_input=20)
    assert [len(s.prompt_ids) for s in capped.requests()] == [20, 20]


@pytest.fixture
def mooncake_trace(tmp_path):
    """60 lines in the Mooncake trace format at its scale: 512-token hash blocks, prompts of 4k to
    200k tokens (some past what a scaled replay keeps), 8 system prompts shared as leading blocks."""
    rng = np.random.default_rng(7)
    lines, next_id, t = [], 1000, 0
    for i in range(60):
        system = list(range(10 * (i % 8), 10 * (i % 8) + int(rng.integers(2, 10))))
        own = int(rng.integers(4, 390))
        input_length = (len(system) + own) * 512 - int(rng.integers(0, 511))
        lines.append({"timestamp": t, "input_length": input_length, "output_length": int(rng.integers(1, 400)),
                      "hash_ids": system + list(range(next_id, next_id + own))})
        next_id += own
        t += int(rng.integers(0, 3000))
    path = tmp_path / "mooncake.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path), lines


def test_mooncake_trace_replays_scaled(mooncake_trace):
    path, lines = mooncake_trace
    specs = make_workload("trace:" + path, num_requests=50, trace_block_tokens=8).requests()
    assert len(specs) == 50 and specs[0].arrival_s == 0.0
    assert all(len(s.prompt_ids) <= 2048 for s in specs)
    assert any(len(s.prompt_ids) == 2048 for s in specs)  # long prompts were cut to trace_max_input
    for spec, line in zip(specs, lines):
        assert len(spec.prompt_ids) == min(-(-line["input_length"] * 8 // 512), 2048)
        assert spec.arrival_s == pytest.approx(line["timestamp"] / 1000.0)
        assert spec.max_tokens == min(line["output_length"], 128)
        assert spec.group == f"prefix-{line['hash_ids'][0]}"
    shared_blocks = 0
    for a, b in zip(specs, specs[8:]):  # the same system prompt: shared hash blocks are shared content
        la, lb = lines[a.index], lines[b.index]
        shared = common_prefix(la["hash_ids"], lb["hash_ids"])
        assert common_prefix(a.prompt_ids, b.prompt_ids) == min(8 * shared, len(a.prompt_ids), len(b.prompt_ids))
        shared_blocks += shared
    assert shared_blocks >= 42 * 2
    assert common_prefix(specs[0].prompt_ids, specs[1].prompt_ids) == 0  # different system prompts


def test_a_gzipped_trace_replays_as_the_plain_one(mooncake_trace, tmp_path):
    path, _ = mooncake_trace
    packed = tmp_path / "mooncake.jsonl.gz"
    packed.write_bytes(gzip.compress(pathlib.Path(path).read_bytes()))
    plain = make_workload("trace:" + path, trace_block_tokens=8).requests()
    assert make_workload(f"trace:{packed}", trace_block_tokens=8).requests() == plain
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="cannot read trace file"):
        make_workload(f"trace:{broken}")


@pytest.mark.parametrize("name, knobs, message", [
    ("nope", {}, "unknown workload 'nope'"),
    ("random", {"groups": 3}, "has no knob 'groups'"),
    ("shared-prefix", {"groups": 0}, "--groups must be at least 1"),
    ("doc-qa", {"zipf": -1.0}, "--zipf must be at least 0"),
    ("trace:/no/such/file.jsonl", {}, "does not exist"),
])
def test_make_workload_rejects_bad_names_and_knobs(name, knobs, message):
    with pytest.raises(ValueError, match=message):
        make_workload(name, **knobs)


# --- arrivals ----------------------------------------------------------------------------------

def test_arrivals_have_the_rate_and_burstiness_asked():
    poisson = np.diff(arrival_times(50.0, 1.0, 20_000, seed=1))
    bursty = np.diff(arrival_times(50.0, 0.25, 20_000, seed=1))
    assert poisson.mean() == pytest.approx(0.02, rel=0.05) and bursty.mean() == pytest.approx(0.02, rel=0.05)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.1)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.1)  # CV of gamma = 1/sqrt(shape)
    assert arrival_times(5.0, 1.0, 10, 3) == arrival_times(5.0, 1.0, 20, 3)[:10]
    assert 80 < count_within(10.0, 1.0, 10.0, seed=0) < 120
    for bad in ({"rate": 0.0}, {"concurrency": 0}, {"rate": 1.0, "concurrency": 2}, {"rate": 1.0, "burstiness": 0}):
        with pytest.raises(ValueError):
            ArrivalConfig(**bad)


# --- client timing against a stub with known delays --------------------------------------------

def stub_app(first_delay=0.2, gap=0.05, tokens=5, reject=False):
    state = {"now": 0, "max": 0, "sends": []}

    async def models(_request):
        return web.json_response({"data": [{"id": "stub-model"}]})

    async def completions(request):
        body = await request.json()
        state["sends"].append((asyncio.get_running_loop().time(), body))
        if body.get("model") != "stub-model" or not body.get("ignore_eos") or not body.get("stream"):
            return web.json_response({"error": {"message": "bad request body"}}, status=400)
        if reject and body["prompt"][0] % 3 == 0:
            return web.json_response({"error": {"message": "prompt rejected"}}, status=400)
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-kvroute-instance": "stub-1"})
            await resp.prepare(request)
            await asyncio.sleep(first_delay)
            for i in range(tokens):
                if i:
                    await asyncio.sleep(gap)
                chunk = {"choices": [{"index": 0, "text": f"t{i}", "finish_reason": None}]}
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            if (body.get("stream_options") or {}).get("include_usage"):  # OpenAI: only when asked
                usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": tokens,
                         "prompt_tokens_details": {"cached_tokens": 16}}
                await resp.write(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            state["now"] -= 1

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app, state


@pytest.fixture
async def stub():
    servers = []

    async def start(**kwargs):
        app, state = stub_app(**kwargs)
        server = await LoopbackServer(app).start()
        servers.append(server)
        return server.url, state

    yield start
    for server in servers:
        await server.close()


async def test_ttft_and_tpot_match_the_servers_delays(stub):
    url, _ = await stub(first_delay=0.2, gap=0.05, tokens=5)
    workload = make_workload("random", num_requests=2, input_tokens=20, output_tokens=5)
    result = await run_load(LoadConfig(target=url + "/v1", arrival=ArrivalConfig(rate=100.0)), workload)
    assert result.model == "stub-model" and len(result.records) == 2
    for r in result.records:
        assert r.ok and r.instance == "stub-1" and r.output_tokens == 5
        assert r.ttft_s == pytest.approx(0.2, abs=0.04)
        assert r.tpot_s == pytest.approx(0.05, abs=0.015)
        assert len(r.itl_s) == 4 and all(g == pytest.approx(0.05, abs=0.03) for g in r.itl_s)
        assert r.e2e_s == pytest.approx(0.4, abs=0.08)
        assert r.prompt_tokens == 20 and r.cached_tokens == 16


async def test_http_errors_are_recorded_not_raised(stub):
    url, _ = await stub(first_delay=0.0, gap=0.0, tokens=2, reject=True)
    workload = make_workload("random", num_requests=30, input_tokens=4, output_tokens=2)
    result = await run_load(LoadConfig(target=url, arrival=ArrivalConfig(concurrency=8)), workload)
    bad = [r for r in result.records if not r.ok]
    expected = sum(s.prompt_ids[0] % 3 == 0 for s in workload.requests())
    assert len(result.records) == 30 and 0 < len(bad) == expected
    assert all(r.status == 400 and r.error == "prompt rejected" for r in bad)


async def test_closed_loop_caps_concurrency_and_turns_wait_for_think_time(stub):
    url, state = await stub(first_delay=0.03, gap=0.0, tokens=2)
    workload = make_workload("multi-turn", num_requests=9, turns=3, question_tokens=4, answer_tokens=2,
                             think_time=0.1)
    result = await run_load(LoadConfig(target=url, arrival=ArrivalConfig(concurrency=2)), workload)
    assert len(result.records) == 9 and all(r.ok for r in result.records)
    assert state["max"] == 2
    by_index = {r.index: r for r in result.records}
    for spec in workload.requests():
        if spec.after is not None:
            assert by_index[spec.index].send_s >= by_index[spec.after].end_s + 0.1 - 0.005


async def test_stop_event_interrupts_and_keeps_finished_requests(stub):
    url, _ = await stub(first_delay=0.02, gap=0.0, tokens=1)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, stop.set)
    workload = make_workload("random", num_requests=1000, input_tokens=4, output_tokens=1)
    result = await run_load(LoadConfig(target=url, arrival=ArrivalConfig(rate=50.0)), workload, stop=stop)
    assert result.interrupted and 3 <= len(result.records) < 1000 and all(r.ok for r in result.records)
    assert result.unsent == 1000 - len(result.records)


# --- against a real sim engine through the CLI ------------------------------------------------

async def test_cli_against_sim_engine_measures_cache_hits(start_engine, tmp_path, capsys):
    url, _ = await start_engine(time_scale=0.01)
    common = ["--target", url, "--rate", "40", "--num-requests", "24", "--no-progress", "--slo-ttft", "5"]
    shared = ["--workload", "shared-prefix", "--groups", "2", "--prefix-tokens", "256", "--question-tokens", "16",
              "--output-tokens", "8", "--out", str(tmp_path / "shared")]
    control = ["--workload", "random", "--input-tokens", "272", "--output-tokens", "8", "--out", str(tmp_path / "rnd")]
    assert await asyncio.to_thread(main, common + shared) == 0
    assert await asyncio.to_thread(main, common + control) == 0
    s = json.loads((tmp_path / "shared" / "summary.json").read_text())
    r = json.loads((tmp_path / "rnd" / "summary.json").read_text())
    assert s["requests"] == 24 and s["errors"] == 0 and s["goodput"] == 1.0
    assert s["cached_token_ratio"] > 0.5 and r["cached_token_ratio"] == 0.0
    assert s["ttft_p50_s"] > 0 and s["tpot_p50_s"] > 0 and list(s["instance_share"].values()) == [1.0]
    assert s["workload_info"]["prefix_tokens"] == 256
    lines = (tmp_path / "shared" / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 24 and json.loads(lines[0])["output_tokens"] == 8
    assert "TTFT" in capsys.readouterr().out


async def test_out_refuses_an_earlier_run_unless_forced(stub, tmp_path, capsys):
    url, _ = await stub(first_delay=0.0, gap=0.0, tokens=1)
    out = tmp_path / "run1"
    argv = ["--target", url, "--workload", "random", "--rate", "200", "--num-requests", "4", "--input-tokens", "8",
            "--output-tokens", "1", "--no-progress", "--out", str(out)]
    assert await asyncio.to_thread(main, argv) == 0
    first = (out / "requests.jsonl").read_bytes()
    capsys.readouterr()
    assert await asyncio.to_thread(main, [*argv, "--num-requests", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not empty" in err and "--force" in err
    assert (out / "requests.jsonl").read_bytes() == first
    assert await asyncio.to_thread(main, [*argv, "--num-requests", "2", "--force"]) == 0
    assert len((out / "requests.jsonl").read_text().splitlines()) == 2


# --- summary and report ------------------------------------------------------------------------

def hand_made_records():
    records = []
    for i in range(10):  # ttft 0.1 .. 1.0, 11 output tokens, tpot (e2e - ttft) / 10 = 0.01 * (i + 1)
        ttft = 0.1 * (i + 1)
        records.append(RequestRecord(index=i, send_s=float(i), ttft_s=ttft, e2e_s=ttft + 0.1 * (i + 1),
                                     prompt_tokens=100, cached_tokens=50 if i % 2 else 0, output_tokens=11,
                                     instance="a" if i < 6 else "b", status=200))
    records.append(RequestRecord(index=10, send_s=10.0, e2e_s=0.5, status=503, error="overloaded"))
    records.append(RequestRecord(index=11, send_s=10.0, e2e_s=0.5, error="timed out after 1 s"))
    return records


def test_summary_math_on_hand_made_records():
    s = summarize(hand_made_records(), slo_ttft_s=0.55, slo_tpot_s=0.035)
    ttfts = [0.1 * (i + 1) for i in range(10)]
    assert s["requests"] == 12 and s["completed"] == 10 and s["errors"] == 2
    assert s["error_kinds"] == {"overloaded": 1, "timed out after 1 s": 1}
    assert s["ttft_p50_s"] == pytest.approx(0.55) and s["ttft_p90_s"] == pytest.approx(np.percentile(ttfts, 90))
    assert s["ttft_p99_s"] == pytest.approx(0.991)
    assert s["tpot_p50_s"] == pytest.approx(0.055) and s["e2e_p50_s"] == pytest.approx(1.1)
    assert s["cached_token_ratio"] == pytest.approx(250 / 1000)
    assert s["goodput"] == pytest.approx(3 / 12)  # ttft <= 0.55 and tpot <= 0.035: requests 0, 1, 2
    assert s["duration_s"] == pytest.approx(11.0)  # first send 0.0 -> last end: request 9 sent at 9.0, e2e 2.0
    assert s["throughput_rps"] == pytest.approx(10 / 11.0) and s["goodput_rps"] == pytest.approx(3 / 11.0)
    assert s["output_tok_s"] == pytest.approx(110 / 11.0)
    assert s["instance_share"] == {"a": 0.6, "b": 0.4}
    assert summarize([r.to_dict() for r in hand_made_records()], slo_ttft_s=0.55, slo_tpot_s=0.035) == s
    plain = summarize(hand_made_records(), duration_s=5.0)
    assert plain["goodput"] == pytest.approx(10 / 12) and plain["throughput_rps"] == 2.0
    empty = summarize([])
    assert empty["requests"] == 0 and empty["ttft_p50_s"] is None and empty["cached_token_ratio"] is None


def test_report_writes_json_markdown_and_plots(tmp_path):
    records = hand_made_records()
    runs = [Run("kv_aware", summarize(records), records), ("round_robin", summarize(records[:5]), records[:5])]
    written = write_report(tmp_path / "report", runs)
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert [r["name"] for r in results] == ["kv_aware", "round_robin"]
    for key in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "cached_token_ratio", "goodput", "requests",
                "errors"):
        assert key in results[0]
    md = (tmp_path / "report" / "results.md").read_text()
    assert "| run |" in md and "| kv_aware |" in md and "| round_robin |" in md
    for name in ("ttft_cdf.png", "ttft_over_time.png", "requests_per_instance.png"):
        data = written[name].read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 1000


# --- bad arguments -----------------------------------------------------------------------------

def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args, message", [
    (["--workload", "nope", "--rate", "1"], "unknown workload"),
    (["--workload", "random", "--rate", "0"], "--rate must be positive, got 0"),
    (["--workload", "random", "--rate", "-2"], "--rate must be positive, got -2"),
    (["--workload", "random", "--concurrency", "0"], "--concurrency must be at least 1"),
    (["--workload", "trace:/no/such/trace.jsonl"], "does not exist"),
    (["--workload", "random"], "needs --rate"),
    (["--workload", "random", "--rate", "1", "--groups", "2"], "--groups does not apply"),
    (["--workload", "random", "--rate", "x"], "--rate: takes a number, got 'x'"),
    (["--workload", "random", "--rate", "1", "--prompt-format", "txt"], "invalid choice 'txt' (did you mean text?)"),
    (["--workload", "random", "--rate", "1", "--promt-format", "text"], "(did you mean --prompt-format?)"),
    (["--workload", "random", "--rate", "1", "--slo-ttft", "0"], "--slo-ttft must be positive"),
    (["--workload", "random", "--rate", "1", "--target", "http://127.0.0.1:{port}"], "cannot reach"),
])
def test_bad_arguments_give_one_line_and_nonzero_exit(args, message, tmp_path, capsys):
    args = [a.format(port=closed_port()) for a in args]
    if "--target" not in args:
        args += ["--target", f"http://127.0.0.1:{closed_port()}"]
    code = main(args + ["--out", str(tmp_path / "out"), "--no-progress"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert lines[-1].startswith("kvroute loadgen: ") and message in lines[-1]
    assert len(lines) == 1 or len(lines) == 2 and lines[0].startswith("usage: kvroute loadgen --target URL --out DIR")
    assert not (tmp_path / "out").exists()


def test_progress_line_counts_done_and_errors():
    import io

    from kvroute.loadgen.progress import Progress

    progress = Progress(stream=io.StringIO())
    progress.total = 3
    progress.add(RequestRecord(index=0, ttft_s=0.25, status=200))
    progress.add(RequestRecord(index=1, status=500, error="boom"))
    line = progress.line()
    assert "2/3" in line and "errors 1" in line and "ttft p50 0.250s" in line
