"""The request fields kvroute reads, what the OpenAI API allows in each, and a pool of
JSON values to put there: the wrong-type part of the fuzzer.

Each `Field` knows the JSON path it lives at (in a completion or a chat body) and which
values the API accepts (`valid`, written from the API's rules, not from kvroute's
parser, so a parser that accepts too much is caught). Every pool value that is not
valid for a field makes one malformed body. `null` counts only for required fields:
for optional ones it means "the default". Fields kvroute ignores (`user`, `name`, ...)
are not fuzzed: ignoring them is the OpenAI-compatible answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

INT64 = 1 << 63

# (raw JSON text, its value): the raw text is what goes on the wire.
POOL: tuple[tuple[str, Any], ...] = tuple((raw, __import__("orjson").loads(raw)) for raw in (
    "null", "true", "false", "0", "1", "-1", "2", "1.0", "1.5", "-0.5", '""', '"x"', '"1"', '"true"', "[]", "[1]",
    '["x"]', "[null]", "[[]]", "{}", '{"a": 1}', '[{"type": "text"}]', '{"role": "user"}',
))


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _text_part(v) -> bool:
    return isinstance(v, dict) and v.get("type") == "text" and isinstance(v.get("text"), str)


def _prompt(v) -> bool:
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
        v = v[0]  # a batch of one
    if isinstance(v, str):
        return bool(v)
    return isinstance(v, list) and bool(v) and all(_is_int(t) and 0 <= t < 8192 for t in v)


def _stop(v) -> bool:
    if isinstance(v, str):
        return bool(v)
    return isinstance(v, list) and len(v) <= 4 and all(isinstance(s, str) and s for s in v)


@dataclasses.dataclass(frozen=True)
class Field:
    path: tuple  # keys (and list indices) from the body's root
    kinds: tuple[str, ...]  # "completion", "chat"
    valid: Callable[[Any], bool]
    required: bool = False

    @property
    def name(self) -> str:
        return ".".join(str(p) for p in self.path)


SAMPLING = ("completion", "chat")
FIELDS: tuple[Field, ...] = (
    Field(("model",), SAMPLING, lambda v: v == "kvroute-tiny"),  # another name is a 404
    Field(("prompt",), ("completion",), _prompt, required=True),
    Field(("messages",), ("chat",), lambda v: False, required=True),  # no pool value is a message list
    Field(("messages", 0), ("chat",), lambda v: False, required=True),
    Field(("messages", 0, "role"), ("chat",), lambda v: isinstance(v, str) and bool(v), required=True),
    Field(("messages", 0, "content"), ("chat",),
          lambda v: isinstance(v, str) or (isinstance(v, list) and all(map(_text_part, v))), required=True),
    Field(("messages", 0, "content", 0), ("chat",), _text_part, required=True),
    Field(("messages", 0, "content", 0, "text"), ("chat",), lambda v: isinstance(v, str), required=True),
    Field(("messages", 0, "content", 0, "type"), ("chat",), lambda v: v == "text", required=True),
    Field(("stream",), SAMPLING, lambda v: isinstance(v, bool)),
    Field(("stream_options",), SAMPLING,
          lambda v: isinstance(v, dict) and isinstance(v.get("include_usage", False), bool)),
    Field(("stream_options", "include_usage"), SAMPLING, lambda v: isinstance(v, bool)),
    Field(("n",), SAMPLING, lambda v: _is_int(v) and v == 1),
    Field(("max_tokens",), SAMPLING, lambda v: _is_int(v) and 1 <= v <= 64),
    Field(("max_completion_tokens",), SAMPLING, lambda v: _is_int(v) and 1 <= v <= 64),
    Field(("temperature",), SAMPLING, lambda v: _is_num(v) and 0 <= v <= 2),
    Field(("top_p",), SAMPLING, lambda v: _is_num(v) and 0 < v <= 1),
    Field(("seed",), SAMPLING, lambda v: _is_int(v) and -INT64 <= v < INT64),
    Field(("stop",), SAMPLING, _stop),
    Field(("ignore_eos",), SAMPLING, lambda v: isinstance(v, bool)),
    Field(("cache_salt",), SAMPLING, lambda v: isinstance(v, str)),
)

# Numbers past the edges, as raw JSON (some are past what a JSON parser takes at all).
OUT_OF_RANGE: dict[str, tuple[str, ...]] = {
    "max_tokens": ("0", "-1", "-9223372036854775808", "9223372036854775807", "18446744073709551615",
                   "18446744073709551616", "100000000000000000000000000000", "1e3", "1e400"),
    "max_completion_tokens": ("0", "-5", "9223372036854775807", "18446744073709551616"),
    "temperature": ("-0.0001", "2.0001", "1e308", "-1e308", "1e400", "-1e400", "100"),
    "top_p": ("0", "-0.0", "1.0000001", "2", "-1e308", "1e400"),
    "seed": ("9223372036854775808", "-9223372036854775809", "18446744073709551615", "18446744073709551616", "1e19"),
    "n": ("0", "2", "-1", "9223372036854775807", "100"),
    "stop": ('["a", "b", "c", "d", "e"]', '["", "x"]', '[""]', '""', "[" + ", ".join(['"s"'] * 1000) + "]"),
}

BASE = {
    "completion": {"prompt": "Hello there, how are you today?", "max_tokens": 2},
    "chat": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}], "max_tokens": 2},
}
PATHS = {"completion": "/v1/completions", "chat": "/v1/chat/completions"}
