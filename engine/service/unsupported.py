"""Request fields a kvroute engine cannot honour: a 400 that says so, never a silent ignore.

One table, field -> (is the value harmless?, why it is refused). Harmless values are
the ones that ask for nothing (`tools: []`, `tool_choice: "none"`,
`response_format: {"type": "text"}`, `echo: false`, ...). The router does not refuse
these itself: an engine that honours them (vLLM, SGLang) may sit behind it, and a
kvroute engine's 400 is relayed to the client unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvroute.router.contract.errors import BadRequest


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {} or value is False or value == ""


def _text_format(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and value.get("type", "text") == "text")


def _one(value: Any) -> bool:
    return value is None or value == 1


def _text_only(value: Any) -> bool:
    return value is None or value == ["text"]


TOOLS = "kvroute engines do not do tool calling"
GUIDED = "kvroute engines do not constrain output (structured outputs / guided decoding)"
UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tools": (_empty, TOOLS),
    "functions": (_empty, TOOLS),
    "function_call": (lambda v: v in (None, "none"), TOOLS),
    "tool_choice": (lambda v: v in (None, "none", "auto"), TOOLS),
    "response_format": (_text_format, "only {\"type\": \"text\"} is supported; " + GUIDED),
    "guided_json": (_empty, GUIDED),
    "guided_regex": (_empty, GUIDED),
    "guided_choice": (_empty, GUIDED),
    "guided_grammar": (_empty, GUIDED),
    "structured_outputs": (_empty, GUIDED),
    "echo": (_empty, "echoing the prompt is not supported"),
    "suffix": (_empty, "insertion (suffix) is not supported"),
    "best_of": (_one, "only best_of=1 is supported"),
    "prompt_logprobs": (_empty, "prompt logprobs are not supported (logprobs of generated tokens are)"),
    "min_tokens": (lambda v: v in (None, 0), "min_tokens is not supported; use ignore_eos"),
    "modalities": (_text_only, "only text output is supported"),
    "audio": (_empty, "only text output is supported"),
    "prediction": (_empty, "predicted outputs are not supported"),
}


def refuse_unsupported(body: dict) -> None:
    """Raise BadRequest (code unsupported_parameter) for the first field this engine cannot honour."""
    for name, (harmless, why) in UNSUPPORTED.items():
        if name in body and not harmless(body[name]):
            raise BadRequest(f"'{name}' is not supported: {why}", param=name, code="unsupported_parameter")
