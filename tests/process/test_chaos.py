"""`kvroute chaos`: its parts on their own, and a quick run end to end (fuzz sample + engine kill)."""

import json
import os
import subprocess
import sys

import pytest

from kvroute.loadgen.chaos import fuzz_cases as fc
from kvroute.loadgen.chaos.cli import main
from kvroute.loadgen.chaos.fuzz import judge
from kvroute.loadgen.chaos.fuzz_kv import kv_cases
from kvroute.loadgen.chaos.httpraw import RawRequest, RawResponse, send
from kvroute.loadgen.chaos.invariants import LogWatch, check_rows
from kvroute.loadgen.chaos.procs import Proc
from kvroute.loadgen.chaos.rows import Row, markdown
from kvroute.loadgen.chaos.scenarios.fuzzing import catalog
from kvroute.router.contract.limits import Limits

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIMITS = Limits(vocab_size=8192, max_model_len=4096, max_body_bytes=1 << 20, max_prompt_chars=32768)
CATEGORIES = {"json", "utf8", "types", "range", "tokens", "huge", "deep", "kv"}


def test_catalog_has_every_category_and_over_2000_bodies_in_all():
    router, engine = catalog(LIMITS, "http://127.0.0.1:9", "router"), catalog(LIMITS, "http://127.0.0.1:9", "engine")
    assert len(router) + len(engine) >= 2000
    assert {c.category for c in router} == {c.category for c in engine} == CATEGORIES
    assert {c.expect for c in router if c.category == "kv"} == {"stripped"}
    assert {c.expect for c in engine if c.category == "kv"} == {"4xx"}
    sizes = [c.request.body.size for c in engine if isinstance(c.request.body, fc.Filler)]
    assert sizes and min(sizes) >= 50 << 20
    deep = [c for c in engine if c.category == "deep" and "100k" in c.name]
    assert deep and all(c.request.body.count(b"[") >= 100_000 or c.request.body.count(b"{") >= 100_000 for c in deep)


def test_kv_cases_point_every_address_at_the_canary():
    import re

    addresses = [a for c in kv_cases("http://127.0.0.1:4242", "engine")
                 for a in re.findall(rb'"address":"([^"]*)"', c.request.body)]
    assert len(addresses) > 50 and set(addresses) - {b"x"} == {b"http://127.0.0.1:4242"}  # "x": a wrong value


def _resp(status, body=b"", ctype="application/json"):
    return RawResponse(status, {"content-type": ctype}, body, 0.01)


def test_judge_accepts_only_4xx_openai_errors():
    case = fc.FuzzCase("types", "x", RawRequest("/v1/completions"))
    error = b'{"error": {"message": "bad", "type": "invalid_request_error", "code": null}}'
    assert judge(case, _resp(400, error)) is None
    assert "HTTP 500" in judge(case, _resp(500, error))
    assert "HTTP 200" in judge(case, _resp(200, b'{"choices": []}'))
    assert "Content-Type" in judge(case, _resp(400, b"Bad Request", "text/plain"))
    assert "OpenAI error" in judge(case, _resp(400, b'{"error": "bad"}'))
    assert judge(case, RawResponse(None, {}, b"", 10.0, "no answer within 10s")) == "no answer within 10s"
    stripped = fc.FuzzCase("kv", "x", RawRequest("/v1/completions"), "stripped")
    assert judge(stripped, _resp(200, b'{"choices": []}')) is None
    assert "reached the engine" in judge(stripped, _resp(200, b'{"kv_transfer_params": {}}'))


def test_invariants_name_what_broke(tmp_path):
    lost = Row(scenario="engine-kill", traffic="background load", sent=10, ok=8, lost=1, broken=0,
               detail={"examples": ["lost (503): x"]})
    fuzz = Row(scenario="fuzz", traffic="fuzz -> e0", sent=5, ok=5, five_xx=1)
    names = {v.invariant for v in check_rows([lost, fuzz], 200.0)}
    assert names == {"no-loss-before-first-byte", "accounted", "no-5xx-for-bad-input"}
    log = tmp_path / "e0.log"
    log.write_text("ok\n2026 ERROR router.http: unexpected error\nTraceback (most recent call last):\n"
                   '  File "x.py", line 1\nTypeError: boom\n')
    watch = LogWatch([Proc("e0", ["true"], 0, str(log))])
    (v,) = watch.check("fuzz")
    assert v.invariant == "no-traceback" and "TypeError: boom" in v.detail
    assert watch.check("fuzz") == []  # read once
    assert "| engine-kill | background load | 10 | 8 | 1 |" in markdown([lost])


async def test_raw_client_hears_an_early_413_and_survives_a_short_body(start_engine):
    url, _ = await start_engine(time_scale=0.01)
    port = int(url.rsplit(":", 1)[1])
    body = fc.Filler(b'{"prompt": "', b"a", 50 << 20, b'"}')
    for request in (RawRequest("/v1/completions", body, declared_length=body.size),
                    RawRequest("/v1/completions", body, chunked=True)):
        resp = await send("127.0.0.1", port, request, timeout_s=10)
        assert resp.status == 413 and b"request_too_large" in resp.body
    short = await send("127.0.0.1", port, RawRequest("/v1/completions", b'{"prompt"', declared_length=100), 5)
    assert short.status is None and short.error.startswith("closed")


@pytest.mark.parametrize("argv,needle", [(["--engines", "1"], "at least 2"), (["--scenarios", "nope"], "unknown"),
                                         (["--quick", "--scenarios", "router-restart"], "--routers 2")])
def test_bad_flags_are_one_line_errors(argv, needle, capsys):
    try:
        code = main(argv)
    except SystemExit as e:  # the parser's own check
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_quick_run_holds_every_invariant(tmp_path):
    out = tmp_path / "chaos"
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "kvroute", "chaos", "--quick", "--out", str(out),
                           "--fuzz-slow-s", "30"], capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| scenario | traffic | sent |" in proc.stdout and "[chaos" in proc.stderr
    result = json.loads((out / "results.json").read_text())
    assert result["invariants_ok"] and not result["violations"]
    rows = {(r["scenario"], r["traffic"]): r for r in result["rows"]}
    for target in ("router0", "e0"):
        fuzz = rows[("fuzz", f"fuzz -> {target}")]
        assert fuzz["sent"] >= 100 and fuzz["ok"] == fuzz["sent"] and fuzz["five_xx"] == 0
        assert set(fuzz["detail"]["by_category"]) == CATEGORIES
    kill = rows[("engine-kill", "background load")]
    assert kill["lost"] == 0 and kill["sent"] > 0 and kill["eject_s"] is not None and kill["resync_s"] is not None
    assert kill["memory_mb"]["router0"]["peak"] > 0
    assert (out / "results.md").read_text().startswith("| scenario |")
    assert (out / "logs" / "router0.log").exists()



def test_request_limit_scenarios_hold_their_invariants(tmp_path):
    """Two of issue 36's scenarios end to end (the others run in `kvroute chaos`)."""
    out = tmp_path / "chaos"
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "kvroute", "chaos", "--engines", "2", "--routers", "1",
                           "--rate", "5", "--settle-s", "0", "--scenarios", "poisoned-bodies,pd-decode-kill",
                           "--out", str(out)], capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in json.loads((out / "results.json").read_text())["rows"] if r["traffic"] != "background load"]
    poison, normal, pd = rows
    assert poison["statuses"] == {"400": 1000} and poison["detail"]["charged"] == 0 and normal["ok"] == 20
    assert pd["ok"] == pd["sent"] == 12 and pd["detail"]["held_at_kill"] >= 1
