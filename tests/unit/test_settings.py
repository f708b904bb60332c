"""Settings declared once (router/contract/settings.py): every command's flags, environment variables,
checks and docs table come from the components' declarations, and agree with each other."""

import argparse
import ast
import dataclasses

import pytest

from kvroute.engine.config import EngineConfig
from kvroute.loadgen.sim.config import SimConfig
from kvroute.router.contract.cli_parser import Command, given
from kvroute.router.contract.constraints import POSITIVE, Range
from kvroute.router.contract.settings import check_settings, declared, flat, section, setting
from kvroute.router.contract.settings_doc import BEGIN, END, flags_table, with_table
from kvroute.router.contract.settings_values import build, pick, replace
from kvroute.router.service.config import RouterConfig
from kvroute.scripts.flags_doc import ROOT, commands, pages

COMMANDS = commands()


def parse(name: str, argv: list[str], environ: dict | None = None) -> argparse.Namespace:
    return COMMANDS[name].parser(environ={} if environ is None else environ).parse_args(argv)


def usage_error(capsys, name: str, argv: list[str], environ: dict | None = None) -> list[str]:
    with pytest.raises(SystemExit) as e:
        parse(name, argv, environ)
    assert e.value.code == 2
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("name", COMMANDS)
def test_the_flags_are_the_declared_settings_and_the_docs_table_lists_them(name):
    command = COMMANDS[name]
    settings = command.settings()
    names = [d.name for d in settings]
    flags = [f for d in settings for f in d.flags]
    assert len(set(names)) == len(names) and len(set(flags)) == len(flags), f"kvroute {name}: a name twice"
    parser = command.parser(environ={})
    assert set(parser._option_string_actions) - {"-h", "--help"} - {"--no-cuda-graphs"} == set(flags)
    if command.doc:
        page = (ROOT / command.doc).read_text()
        table = page.split(BEGIN.format(prog=command.prog))[1].split(END.format(prog=command.prog))[0]
        rows = [line.split(" | ")[0].removeprefix("| ") for line in table.strip().splitlines()[2:]]
        assert rows == [", ".join(f"`{f}`" for f in d.flags) for d in settings]


def test_every_docs_table_is_up_to_date():
    stale = [str(path.relative_to(ROOT)) for path, text in pages().items() if path.read_text() != text]
    assert not stale, f"run python -m kvroute.scripts.flags_doc: {', '.join(stale)} out of date"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_flag_has_help_and_shows_its_default(name):
    command = COMMANDS[name]
    helps = {a.option_strings[0]: a.help for a in command.parser(environ={})._actions if a.option_strings}
    for d in command.settings():
        assert d.setting.help and d.setting.help != d.field, f"kvroute {name} {d.flag} has no help"
        assert "(default: " in helps[d.flag], f"kvroute {name} {d.flag} hides its default"
        assert d.group and not d.group.startswith(d.owner.__name__ + "("), f"{d.owner.__name__}: no docstring title"


def test_a_workload_knob_shows_each_workloads_default():
    help_text = COMMANDS["loadgen"].parser(environ={}).format_help()
    shift_at = help_text[help_text.index("\n  --shift-at FLOAT"):].split("\n  --")[1]
    assert "share of the requests sent before the shift" in shift_at and "(default: shift 0.5)" in " ".join(
        shift_at.split())
    output = next(d for d in COMMANDS["loadgen"].settings() if d.name == "output_tokens")
    assert output.default_text() == "shared-prefix 32, multi-turn 32, doc-qa 32, random 32, session-storm 16"


def test_a_flag_wins_over_its_environment_variable_which_wins_over_the_default():
    env = {"KVROUTE_ROUTER_PORT": "9001", "KVROUTE_ROUTER_POLICY": "round_robin"}
    args = parse("router", ["--engine", "http://e:1", "--port", "9002"], env)
    assert (args.port, args.policy, args.max_retries) == (9002, "round_robin", 2)
    assert given(args) == {"engines", "port", "policy"}
    args = parse("router", ["--engine", "http://e:1"], env)
    assert args.port == 9001


def test_environment_variables_of_every_kind():
    env = {"KVROUTE_ROUTER_ENGINE": "http://a:1 http://b:2", "KVROUTE_ROUTER_TRUST_TENANT_HEADER": "true",
           "KVROUTE_ROUTER_PRIORITY_EDGES": "-1,0,2", "KVROUTE_ROUTER_SLO_TTFT_S": "0.5", "KVROUTE_ADMIN_KEY": "k"}
    args = parse("router", [], env)
    assert args.engines == ("http://a:1", "http://b:2") and args.trust_tenant_header is True
    assert args.priority_edges == (-1, 0, 2) and args.slo_ttft_s == 0.5 and args.admin_key == "k"
    config = build(RouterConfig, **pick(RouterConfig, vars(args)))
    assert config.admission.slo_ttft_s == 0.5 and config.admission.priority_edges == (-1, 0, 2)
    assert parse("router", [], {**env, "KVROUTE_ROUTER_ADMIN_KEY": "own"}).admin_key == "own"  # its own name first


def test_a_flag_taking_several_items_extends_and_its_variable_splits_them():
    """--lora-modules as vLLM's: several NAME=DIR after one flag, the flag repeated, or the variable."""
    args = parse("engine", ["--lora-modules", "a=/x", "b=/y", "--lora-modules", "c=/z"], {})
    assert args.lora_modules == ("a=/x", "b=/y", "c=/z")
    assert parse("engine", [], {"KVROUTE_ENGINE_LORA_MODULES": "a=/x b=/y"}).lora_modules == ("a=/x", "b=/y")
    config = build(EngineConfig, backend="sim", lora_modules=["a", "b"], max_loras=2)
    assert config.runner.lora_modules == ("a", "b") and config.runner.adapter_slots == 2
    with pytest.raises(ValueError, match="is the base model's"):
        build(EngineConfig, backend="sim", lora_modules=("m",), served_model_name="m")


@pytest.mark.parametrize("var, value, said", [
    ("KVROUTE_ROUTER_PORT", "eighty", "$KVROUTE_ROUTER_PORT: --port takes an integer, got 'eighty'"),
    ("KVROUTE_ROUTER_PORT", "70000", "$KVROUTE_ROUTER_PORT: --port must be between 0 and 65535, got 70000"),
    ("KVROUTE_ROUTER_POLICY", "kv_awar", "$KVROUTE_ROUTER_POLICY: --policy must be one of"),
    ("KVROUTE_ROUTER_TRUST_TENANT_HEADER", "maybe", "takes 1 or 0 (true or false), got 'maybe'"),
])
def test_a_bad_environment_variable_is_one_line_naming_it(capsys, var, value, said):
    lines = usage_error(capsys, "router", ["--engine", "http://e:1"], {var: value})
    assert len(lines) == 1 and lines[0].startswith("kvroute router: ") and said in lines[0]


def test_a_mistyped_flag_gets_a_short_usage_and_a_suggestion(capsys):
    lines = usage_error(capsys, "router", ["--engine", "http://e:1", "--max-retry", "3"])
    assert lines == ["usage: kvroute router [options]  (kvroute router --help lists them)",
                     "kvroute router: unrecognized arguments: --max-retry 3 (did you mean --max-retries?)"]
    lines = usage_error(capsys, "loadgen", ["--target", "t", "--out", "o", "--workload=random", "--rtae=3"])
    assert lines[0] == "usage: kvroute loadgen --target URL --out DIR [options]  (kvroute loadgen --help lists them)"
    assert lines[1].endswith("--rtae=3 (did you mean --rate?)")
    assert usage_error(capsys, "router", ["--frobnicate"])[1] == "kvroute router: unrecognized arguments: --frobnicate"


def test_a_bad_choice_gets_a_suggestion_and_the_choices(capsys):
    lines = usage_error(capsys, "router", ["--engine", "http://e:1", "--policy", "kv_awre"])
    assert len(lines) == 2 and lines[1] == (
        "kvroute router: argument --policy: invalid choice 'kv_awre' (did you mean kv_aware?); choose from "
        "approx_kv, kv_aware, least_load, power_of_two, prefix_hash, random, round_robin")


def test_a_value_out_of_range_is_one_line(capsys):
    assert usage_error(capsys, "engine", ["--num-blocks", "1"]) == [
        "kvroute engine: --num-blocks must be at least 2, got 1"]
    assert usage_error(capsys, "sim", ["--instances", "0"]) == ["kvroute sim: --instances must be at least 1, got 0"]


def test_a_required_flag_is_said_so(capsys):
    assert usage_error(capsys, "planner", [])[1] == "kvroute planner: --router is required"
    assert parse("planner", [], {"KVROUTE_PLANNER_ROUTER": "http://r:1"}).router == "http://r:1"


def test_a_config_made_in_code_is_checked_by_the_same_declarations():
    with pytest.raises(ValueError, match=r"^--recent-ttl-s must be positive, got 0$"):
        RouterConfig(engines=("http://e:1",), recent_ttl_s=0)
    with pytest.raises(ValueError, match=r"^--engine must be an http\(s\) URL, got 'e:1'$"):
        RouterConfig(engines=("e:1",))
    with pytest.raises(ValueError, match=r"^--policy must be one of .*, got 'kv_awre' \(did you mean kv_aware\?\)$"):
        RouterConfig(engines=("http://e:1",), policy="kv_awre")
    with pytest.raises(ValueError, match=r"^--kv-events-replay needs --kv-events-zmq$"):
        build(EngineConfig, kv_events_replay="tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match=r"^--api-key takes a tuple of values, got the string 'k'$"):
        RouterConfig(engines=("http://e:1",), api_key="k")  # not the keys 'k' one character each


def test_build_gives_each_section_its_own_settings():
    config = build(EngineConfig, port=0, num_blocks=64, backend="sim", host_blocks=8, kv_events_zmq="tcp://h:1")
    assert (config.server.port, config.batch.num_blocks, config.runner.backend) == (0, 64, "sim")
    assert (config.tiers.host_blocks, config.zmq.kv_events_zmq) == (8, "tcp://h:1")
    assert config.batch.block_size == 16 and config.server.host == "127.0.0.1"
    with pytest.raises(TypeError, match="has no setting 'num_block'"):
        build(EngineConfig, num_block=64)
    assert flat(config)["num_blocks"] == 64 and flat(config)["port"] == 0
    assert pick(EngineConfig, {"num_blocks": 1, "log_level": "INFO"}) == {"num_blocks": 1}


def test_a_section_taken_in_part_keeps_its_own_defaults_for_the_rest():
    sim = build(SimConfig, cost_model="a100-llama2-7b", num_blocks=128)
    assert sim.runner.backend == "sim" and sim.runner.kv_link == "nvlink"  # the simulator's defaults, not the engine's
    assert sim.runner.cost_model == "a100-llama2-7b" and sim.batch.num_blocks == 128
    assert replace(sim, kv_link="pcie4", instances=2).runner == dataclasses.replace(sim.runner, kv_link="pcie4")
    with pytest.raises(TypeError, match="has no setting 'event_buffer'"):  # a batch setting the simulator does not take
        build(SimConfig, event_buffer=5)
    flags = {d.flag for d in declared(SimConfig)}
    assert {"--cost-model", "--kv-link", "--num-blocks", "--host-blocks", "--event-delay"} <= flags
    assert not {"--backend", "--device", "--event-buffer", "--kv-store-id", "--port"} & flags
    assert next(d for d in declared(SimConfig) if d.flag == "--kv-link").default == "nvlink"


def test_sim_flags_given_override_the_suite_cluster_only():
    from kvroute.loadgen.sim.cli import _config
    from kvroute.loadgen.sim.suite import SUITE_CONFIG

    config = _config(parse("sim", ["--suite", "--instances", "4"]))
    assert config.instances == 4 and config.batch.num_blocks == SUITE_CONFIG.batch.num_blocks == 1024
    assert _config(parse("sim", ["--suite", "--num-blocks", "4096"])).batch.num_blocks == 4096  # the default, given
    assert _config(parse("sim", ["--suite"], {"KVROUTE_SIM_NUM_BLOCKS": "2048"})).batch.num_blocks == 2048


def test_the_docs_table_is_rewritten_between_its_markers():
    command = COMMANDS["chaos"]
    page = f"# Page\n\n{BEGIN.format(prog=command.prog)}\nstale\n{END.format(prog=command.prog)}\n\nafter\n"
    written = with_table(page, command)
    assert written.startswith("# Page\n\n") and written.endswith("\n\nafter\n") and "stale" not in written
    assert flags_table(command) in written and with_table(written, command) == written
    assert "| `--engines` | `KVROUTE_CHAOS_ENGINES` | 3; --quick 2 | >= 2 |" in written
    with pytest.raises(ValueError, match="no flags markers for kvroute chaos"):
        with_table("# Page\n", command)


def test_a_declaration_carries_type_default_constraint_and_help():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Inner:
        """inner part"""

        depth: int = setting(3, "how deep", check=Range(1, 9))

        def __post_init__(self) -> None:
            check_settings(self)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Outer:
        """outer part"""

        rate: float | None = setting(None, "per second", check=POSITIVE)
        names: tuple[str, ...] = setting((), "a name (repeat)", flag="name")
        inner: Inner = section(Inner)

        def __post_init__(self) -> None:
            check_settings(self)

    command = Command(prog="kvroute test", description="d", env_prefix="KVROUTE_TEST_", sections=(Outer,))
    args = command.parser(environ={"KVROUTE_TEST_NAME": "a b"}).parse_args(["--depth", "4"])
    assert (args.rate, args.names, args.depth) == (None, ("a", "b"), 4)
    assert build(Outer, **pick(Outer, vars(args))) == Outer(names=("a", "b"), inner=Inner(depth=4))
    assert [d.group for d in command.settings()] == ["outer part", "outer part", "inner part"]
    with pytest.raises(ValueError, match=r"^--depth must be between 1 and 9, got 10$"):
        Inner(depth=10)
    with pytest.raises(ValueError, match=r"^--rate must be positive, got -1$"):
        Outer(rate=-1)


def test_the_engine_core_config_imports_neither_runners_nor_tiers():
    tree = ast.parse((ROOT / "engine" / "core" / "config.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert all(not m.startswith("kvroute") or m.startswith("kvroute.router.contract") for m in imported), imported


def test_every_command_parser_is_made_from_settings():
    """No flag is declared by hand: the product's only add_argument is the settings parser's (the developer
    commands in kvroute/benchmarks and kvroute/scripts keep their own argparse)."""
    tools = (ROOT / "kvroute" / "benchmarks", ROOT / "kvroute" / "scripts")
    by_hand = [str(p.relative_to(ROOT)) for package in ("router", "engine", "loadgen", "kvroute")
               for p in (ROOT / package).rglob("*.py") if not p.is_symlink() and "add_argument(" in p.read_text()
               and p.name != "cli_parser.py" and not any(t in p.parents for t in tools)]
    assert not by_hand, by_hand
    assert all(isinstance(c.parser(environ={}), argparse.ArgumentParser) for c in COMMANDS.values())


def documented_commands() -> list[tuple[str, str, str]]:
    """(page, command, its flags as written) for every `kvroute COMMAND ...` line in the README's and the
    docs' code blocks (continuation lines joined, comments dropped)."""
    out = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text().replace("\\\n", " ")
        blocks = text.split("```")[1::2]
        for line in (ln.split(" #")[0] for b in blocks for ln in b.splitlines()):
            words = line.replace("[", " ").replace("]", " ").replace("&&", " ").split()
            for i, w in enumerate(words[:-1]):
                if w == "kvroute" and words[i + 1] in COMMANDS:
                    flags = [t.split("=")[0] for t in words[i + 2:] if t.startswith("--")]
                    out += [(page.name, words[i + 1], f) for f in flags]
    return out


def test_every_documented_flag_exists():
    known = {name: {f for d in c.settings() for f in d.flags} | {"--help", "--no-cuda-graphs"}
             for name, c in COMMANDS.items()}
    found = documented_commands()
    assert len(found) > 50, "the README and docs quote commands"
    missing = sorted({f"{page}: kvroute {name} {flag}" for page, name, flag in found if flag not in known[name]})
    assert not missing, "\n".join(missing)
