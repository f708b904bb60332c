"""`--out DIR` never silently replaces an earlier run (loadgen/out_dir.py), and `kvroute sim --profile --out`
writes its file."""

import json

import pytest

from kvroute.loadgen import bench
from kvroute.loadgen.chaos.cli import main as chaos_main
from kvroute.loadgen.demo import main as demo_main
from kvroute.loadgen.out_dir import check_out_dir
from kvroute.loadgen.sim import main as sim_main


def test_only_an_empty_or_new_directory_passes_without_force(tmp_path):
    check_out_dir(tmp_path / "new", force=False)
    check_out_dir(tmp_path, force=False)
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(ValueError, match="is not empty .*--force"):
        check_out_dir(tmp_path, force=False)
    check_out_dir(tmp_path, force=True)
    with pytest.raises(ValueError, match="is not a directory"):
        check_out_dir(tmp_path / "summary.json", force=True)


@pytest.mark.parametrize("main", [bench.main, demo_main, chaos_main], ids=["bench", "demo", "chaos"])
def test_a_non_empty_out_is_refused_in_one_line_before_anything_starts(main, tmp_path, capsys):
    earlier = tmp_path / "results.json"
    earlier.write_text('{"an": "earlier run"}')
    assert main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {tmp_path} is not empty" in err and "--force" in err
    assert earlier.read_text() == '{"an": "earlier run"}'


def test_bench_takes_a_non_empty_out_with_force(tmp_path):
    (tmp_path / "results.json").write_text("{}")
    args, _, _ = bench.parse(["--out", str(tmp_path), "--force"])
    assert args.force and args.out == str(tmp_path)


def test_sim_profile_writes_the_out_file(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert sim_main(["--profile", "--cost-model", "a100-llama2-7b", "--slo-tpot", "0.025", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written == json.loads(capsys.readouterr().out)
    assert written["cost_model"] == "a100-llama2-7b" and written["decode_tokens_per_s"] > 0
