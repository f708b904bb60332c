"""kvroute's command lines: every flag documented with its default, one-line errors with exit 2."""

import argparse
import socket
import subprocess
import sys

import pytest

import kvroute.cli
from kvroute.engine.service.cli import build_parser as engine_parser
from kvroute.engine.service.cli import main as engine_main
from kvroute.loadgen.bench import build_parser as bench_parser
from kvroute.loadgen.cli import build_parser as loadgen_parser
from kvroute.loadgen.demo import main as demo_main
from kvroute.loadgen.sim.cli import build_parser as sim_parser
from kvroute.router.service.cli import build_parser as router_parser
from kvroute.router.service.cli import main as router_main

PARSERS = {"engine": engine_parser, "router": router_parser, "loadgen": loadgen_parser, "bench": bench_parser,
           "sim": sim_parser}


@pytest.mark.parametrize("name", PARSERS)
def test_every_flag_has_help_and_shows_its_default(name):
    parser = PARSERS[name]()
    text = parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"kvroute {name} {action.option_strings[0]} has no help line"
        if action.default not in (None, False):
            shown = parser._get_formatter()._get_help_string(action)
            assert "default" in shown, f"kvroute {name} {action.option_strings[0]} hides its default"
    assert "(default: " in text


def test_version(capsys):
    assert kvroute.cli.main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kvroute ") and len(out.split()) == 2


def test_help_into_a_closed_pipe_is_not_a_traceback():
    """`kvroute --help | head -1`: the reader is gone before the help is written."""
    proc = subprocess.Popen([sys.executable, "-m", "kvroute", "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(30)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def exit_code(main, argv: list[str]) -> int:
    """`main(argv)`'s exit status, whether it returns it or its parser exits (argparse's way)."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


@pytest.mark.parametrize("argv, needle, usage", [
    (["--device", "cpux"], "cpu, cuda, cuda:N or mps", False),
    (["--backend", "sim", "--num-blocks", "1"], "--num-blocks must be at least 2, got 1", False),
    (["--backend", "sim", "--cost-model", "foo"], "cpu-tiny", True),
    (["--kv-link", "wifi"], "nvlink", True),
    (["--log-level", "loud"], "DEBUG", True),
])
def test_engine_bad_flags_are_one_line_exit_2(capsys, argv, needle, usage):
    """One line saying what is wrong; after a short usage line when the parser caught it."""
    assert exit_code(engine_main, argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("kvroute engine: ") and needle in lines[-1]
    assert lines[:-1] == (["usage: kvroute engine [options]  (kvroute engine --help lists them)"] if usage else [])


def test_engine_cuda_without_cuda_names_the_devices_here(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert engine_main(["--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device" in err and "valid here: cpu" in err


@pytest.mark.parametrize("main, argv", [(engine_main, ["--backend", "sim"]), (router_main, ["--engine", "http://x:1"])])
def test_a_busy_port_fails_at_once_in_one_line(capsys, main, argv):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert main(argv + ["--port", str(busy.getsockname()[1])]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the port is in use" in err


def test_demo_rejects_a_bad_flag_before_its_banner(capsys):
    assert demo_main(["--bogus"]) == 2
    err = capsys.readouterr().err
    assert err == ("usage: kvroute demo [options]  (kvroute demo --help lists them)\n"
                   "kvroute demo: unrecognized arguments: --bogus\n")
    assert demo_main(["--polices", "kv_aware"]) == 2
    assert capsys.readouterr().err.endswith("unrecognized arguments: --polices kv_aware (did you mean --policies?)\n")


def test_demo_help_lists_bench_flags(capsys):
    assert demo_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: kvroute demo" in out and "--policies" in out and "(default: " in out


def test_report_table_notes_and_verdict():
    from kvroute.loadgen.report import Run, markdown_table, verdict

    base = {"requests": 96, "errors": 0, "ttft_p50_s": 0.03, "ttft_p90_s": 0.2, "throughput_rps": 4.0,
            "output_tok_s": 64.0, "cached_token_ratio": 0.5, "arrival_mode": "open", "arrival": "4 req/s (Poisson)"}
    runs = [Run("round_robin", base), Run("kv_aware", dict(base, ttft_p90_s=0.05, cached_token_ratio=0.9))]
    table = markdown_table(runs)
    header = table.splitlines()[0]
    assert "TTFT p90" in header and "cached" in header
    assert "requests" not in header and "req/s" not in header and "TPOT" not in header
    assert "Same in every run: requests 96, errors 0, TTFT p50 30 ms." in table and "restate the arrival" in table
    assert verdict(runs) == ("kv_aware's TTFT p90 is 0.25x round_robin's (50 ms vs 200 ms); "
                             "cached tokens: round_robin 50%, kv_aware 90%")
    assert verdict(runs[:1]) is None
