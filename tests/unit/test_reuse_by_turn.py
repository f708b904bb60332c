"""kvroute/benchmarks/reuse_by_turn.py: a workload's prompts and blocks by conversation turn."""

import json

from kvroute.benchmarks import reuse_by_turn
from kvroute.benchmarks.reuse_by_turn import split
from kvroute.loadgen.workload_base import RequestSpec

BS = 4


def spec(index, prompt, after=None, think_s=0.0):
    return RequestSpec(index=index, prompt_ids=tuple(prompt), max_tokens=1, after=after, think_s=think_s)


def test_a_prompt_extending_an_earlier_one_whole_is_its_next_turn():
    first = spec(0, range(8))  # two blocks
    other = spec(1, range(100, 108))  # shares nothing
    second = spec(2, range(12))  # first's blocks and one more: turn 1, sent at 10
    third = spec(3, range(16), after=2, think_s=90.0)  # a follow-up of second: turn 2, planned at 100
    partial = spec(4, [*range(4), 50, 51, 52, 53])  # first's first block only: not a continuation
    starts = [(0.0, first), (1.0, other), (10.0, second), (200.0, partial)]
    got = split([first, other, second, third, partial], starts, BS, idles=(5.0,), soon=60.0)
    assert got.prompts == {0: {"prompts": 3, "continued": 1, "continued_soon": 1},
                           1: {"prompts": 1, "continued": 1, "continued_soon": 0},
                           2: {"prompts": 1, "continued": 0, "continued_soon": 0}}
    # first's 2 blocks come back after 10 s (within 5 more once idle 5), other's 2 and partial's new one
    # never, partial's first block (seen) never again
    assert got.blocks["0/new"] == {5.0: {"idle": 5, "returned": 2}}
    assert got.blocks["0/seen"] == {5.0: {"idle": 1, "returned": 0}}
    # second's 3 blocks: next asked for 90 s later, too late for A = 5
    assert got.blocks["1/seen"] == {5.0: {"idle": 2, "returned": 0}}
    assert got.blocks["1/new"] == {5.0: {"idle": 1, "returned": 0}}
    assert got.blocks["2/seen"] == {5.0: {"idle": 3, "returned": 0}} and got.blocks["2/new"][5.0]["idle"] == 1


def test_a_suite_row_end_to_end(tmp_path, capsys):
    out = tmp_path / "turns.json"
    assert reuse_by_turn.main(["--case", "mooncake", "--idle", "40", "--out", str(out)]) == 0
    assert "prompts by turn" in capsys.readouterr().out
    (run,) = json.loads(out.read_text())
    assert set(run["prompts"]) == {"0", "1", "2", "3"}  # the trace holds conversations of 4 turns and more
    assert all(0 <= v["40.0"]["returned"] <= v["40.0"]["idle"] for v in run["blocks"].values())


def test_bad_arguments_get_one_line_and_exit_2(capsys):
    assert reuse_by_turn.main(["--case", "nope"]) == 2
    assert "no case nope" in capsys.readouterr().err
    for bad in (["--seeds", "x"], ["--idle", "0"], ["--idle", "a"], ["--soon", "-1"]):
        assert reuse_by_turn.main(bad) == 2
        assert "--seeds takes integers" in capsys.readouterr().err
