"""The workload knobs as flags: each workload's config fields (loadgen/workloads/*.py, where their
types, defaults and checks are declared), one flag per knob name, its help here. A knob not given
keeps the workload's own default; `--help` and the docs list each workload's."""

from __future__ import annotations

import dataclasses

from kvroute.router.contract.settings import Declared, Setting

KNOB_HELP = {
    "groups": "number of groups",
    "prefix_tokens": "tokens of each group's shared system prompt",
    "question_tokens": "tokens of each question",
    "output_tokens": "output tokens per request (max_tokens with ignore_eos)",
    "input_tokens": "prompt tokens",
    "min_input_tokens": "draw prompt lengths uniformly from here to --input-tokens",
    "min_output_tokens": "draw output lengths uniformly from here to --output-tokens",
    "turns": "turns per session",
    "system_tokens": "tokens of a system prompt shared by all sessions",
    "answer_tokens": "synthetic answer tokens appended after each turn",
    "think_time": "seconds between a turn's end and the next turn",
    "documents": "number of documents",
    "doc_tokens": "tokens per document",
    "zipf": "Zipf exponent of document popularity (0 = uniform)",
    "prompt_heavy_input_tokens": "prompt tokens before the shift (lengths drawn from --spread x to 1 x this)",
    "prompt_heavy_output_tokens": "output tokens before the shift",
    "decode_heavy_input_tokens": "prompt tokens after the shift",
    "decode_heavy_output_tokens": "output tokens after the shift",
    "shift_at": "share of the requests sent before the shift, in [0, 1]",
    "spread": "lengths are drawn uniformly between spread x and 1 x each phase's figures, in (0, 1]",
    "sessions": "sessions that go idle and come back",
    "context_tokens": "tokens of a session's first turn (its reusable context)",
    "min_context_tokens": "draw context lengths uniformly from here to --context-tokens",
    "session_rate": "first turns per second",
    "idle_requests": "unrelated requests between the phases (push the sessions out of device memory)",
    "idle_tokens": "tokens of each idle request",
    "idle_rate": "idle requests per second",
    "burst": "sessions that return at once (the storm)",
    "burst_spread": "seconds over which the returning sessions arrive",
    "gap": "seconds between the phases",
    "trace_block_tokens": "tokens per hash id (the trace's blocks are 512)",
    "trace_time_scale": "multiply timestamps by this (2 = half the rate)",
    "trace_max_input": "truncate prompts to this many tokens",
    "trace_max_output": "cap output lengths at this many tokens",
}
NOT_KNOBS = ("num_requests", "path")  # the request count has a flag of its own; a trace's path is in its name


def knob_defaults(configs: dict[str, type]) -> dict[str, dict[str, object]]:
    """{knob: {workload: its default}} over the workloads' config classes, in declaration order."""
    out: dict[str, dict[str, object]] = {}
    for workload, config in configs.items():
        for f in dataclasses.fields(config):
            if f.name not in NOT_KNOBS:
                out.setdefault(f.name, {})[workload] = f.default
    return out


def knob_settings(configs: dict[str, type]) -> list[Declared]:
    """One flag per knob; its value None when not given (each workload keeps its default)."""
    out = []
    for name, defaults in knob_defaults(configs).items():
        kind = type(next(iter(defaults.values())))
        text = ", ".join(f"{w} {v:g}" if isinstance(v, float) else f"{w} {v}" for w, v in defaults.items())
        setting = Setting(help=KNOB_HELP[name], default_text=text,
                          metavar=kind.__name__.upper())
        out.append(Declared(name=name, field=name, owner=configs[next(iter(defaults))], kind=kind, repeat=False,
                            optional=True, default=None, setting=setting, group="workload knobs"))
    return out
