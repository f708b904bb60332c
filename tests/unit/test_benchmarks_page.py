"""tools/benchmarks.py: each entry's command runs, its JSON is rendered under the command, and
entries not run are listed with their command and no figures."""

import sys

from tools import benchmarks
from tools.benchmark_lib import render
from tools.benchmark_lib.entries import BY_NAME, ENTRIES, Entry


def test_registry_has_the_required_entries_and_full_only_ones():
    for name in ("sim-pressure", "sim-pressure-80", "sim-suite", "sim-scale", "bench-quick", "decision",
                 "chaos-quick", "kvevents"):
        assert name in BY_NAME and not BY_NAME[name].full_only
    assert any(e.full_only for e in ENTRIES)
    assert all("{out}" in " ".join(e.args) for e in ENTRIES)


def test_an_entry_runs_and_its_json_is_rendered_under_its_command(tmp_path):
    code = ("import json, sys; json.dump({'results': {'kv_aware': {'ttft_p90_s': 0.0138, 'cached_token_ratio': "
            "0.961}}, 'relative_to_oracle': {'kv_aware': {'ttft_p90': 0.92, 'cached_token_ratio': 1.01}}}, "
            "open(sys.argv[1], 'w'))")
    entry = Entry(name="fake", title="A fake sim", about="About it.", args=("-c", code, "{out}"), out="fake.json",
                  render=render.sim)
    outcome = benchmarks.run_entry(entry, tmp_path)
    assert outcome["ok"], outcome
    text = benchmarks.section(entry, outcome)
    assert text.index("```bash\npython -c") < text.index("| kv_aware | - | 13.8 ms | - | 96.1% | 1.010 | 0.92 |")


def test_a_failed_command_is_reported_not_rendered(tmp_path):
    entry = Entry(name="bad", title="Bad", about="", args=("-c", "import sys; sys.exit('no {out}')"), out="x.json")
    outcome = benchmarks.run_entry(entry, tmp_path)
    assert not outcome["ok"] and "exit 1" in outcome["error"]
    assert "Failed after" in benchmarks.section(entry, outcome)


def test_the_page_lists_entries_not_run_with_their_command():
    outcomes = {e.name: None for e in ENTRIES}
    page = benchmarks.page(outcomes, ["--only", "x"], benchmarks.machine_line())
    assert "Machine: " in page and " cores, load average " in page and "commit " in page
    assert benchmarks.shown(BY_NAME["sim-suite"]) in page
    assert page.count("Not run for this page") == len(ENTRIES)
    assert "(issue" not in page
    assert sys.executable not in page
